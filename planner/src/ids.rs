//! Typed u32 ids into the plan's arenas. They print as `u3`, `op41`, `b12`.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id {
    ($name:ident, $prefix:literal) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub u32);
        impl $name {
            pub fn index(self) -> usize {
                self.0 as usize
            }
            pub fn new(i: usize) -> Self {
                // Plans are far below 2^32 items; saturate rather than wrap.
                $name(u32::try_from(i).unwrap_or(u32::MAX))
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

id!(UnitId, "u");
id!(OpId, "op");
id!(BufferId, "b");
