//! Learning-rate schedules, as torchtitan's `linear_warmup_stable_decay` (torch's LambdaLR
//! over it: optimizer step `i`, 0-based, runs at `lr · factor(i)`): a linear warmup from
//! `lr/(warmup+1)` to `lr`, a stable stretch, then a decay over the last `decay` steps to
//! `min_lr` (linear or cosine). `constant` has no decay; `linear` and `cosine` decay over every
//! step after the warmup (unless `--decay-steps` says fewer); `wsd` holds the rate and decays
//! linearly over the last `--decay-steps` (default: a tenth of the run).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Constant,
    Linear,
    Cosine,
    Wsd,
}

impl Kind {
    pub fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "constant" => Kind::Constant,
            "linear" => Kind::Linear,
            "cosine" => Kind::Cosine,
            "wsd" => Kind::Wsd,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    pub kind: Kind,
    /// The peak learning rate.
    pub lr: f64,
    pub warmup: u64,
    /// Steps of the decay (`None`: the kind's default over a run of `steps`).
    pub decay: Option<u64>,
    /// The rate the decay ends at.
    pub min_lr: f64,
    /// The run's total steps (where the decay ends).
    pub steps: u64,
}

impl Schedule {
    pub fn constant(lr: f64) -> Schedule {
        Schedule { kind: Kind::Constant, lr, warmup: 0, decay: None, min_lr: 0.0, steps: 0 }
    }

    /// Steps the rate decays over.
    pub fn decay_steps(&self) -> u64 {
        let after = self.steps.saturating_sub(self.warmup);
        match self.kind {
            Kind::Constant => 0,
            Kind::Linear | Kind::Cosine => self.decay.unwrap_or(after).min(after),
            Kind::Wsd => self.decay.unwrap_or(self.steps / 10).min(after),
        }
    }

    /// The factor of optimizer step `i` (0-based), torchtitan's formula.
    pub fn factor(&self, i: u64) -> f64 {
        let (w, d) = (self.warmup, self.decay_steps());
        let stable_end = self.steps.saturating_sub(d).max(w);
        if i < w {
            return (i + 1) as f64 / (w + 1) as f64;
        }
        if d == 0 || i < stable_end {
            return 1.0;
        }
        let progress = (((i + 1) - stable_end) as f64 / d as f64).min(1.0);
        let m = if self.lr > 0.0 { self.min_lr / self.lr } else { 0.0 };
        let shape = match self.kind {
            Kind::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
            _ => 1.0 - progress,
        };
        m + (1.0 - m) * shape
    }

    /// The learning rate of optimizer step `i` (0-based).
    pub fn lr_at(&self, i: u64) -> f64 {
        self.lr * self.factor(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_to_the_minimum() {
        let s = Schedule { kind: Kind::Cosine, lr: 1.0, warmup: 3, decay: None, min_lr: 0.1, steps: 13 };
        let f: Vec<f64> = (0..13).map(|i| s.factor(i)).collect();
        assert_eq!(&f[..3], &[0.25, 0.5, 0.75]);
        // decay over the 10 steps after the warmup: the last step reaches the minimum
        assert!((f[12] - 0.1).abs() < 1e-12 && f[3] < 1.0 && f[3] > f[4]);
        assert!(f.windows(2).skip(3).all(|w| w[1] < w[0]));
    }

    #[test]
    fn wsd_holds_then_decays_over_its_last_steps() {
        let s = Schedule { kind: Kind::Wsd, lr: 2.0, warmup: 1, decay: Some(4), min_lr: 0.0, steps: 10 };
        let lr: Vec<f64> = (0..10).map(|i| s.lr_at(i)).collect();
        assert_eq!(&lr[..6], &[1.0, 2.0, 2.0, 2.0, 2.0, 2.0]);
        assert_eq!(&lr[6..], &[1.5, 1.0, 0.5, 0.0]);
        assert_eq!(Schedule::constant(0.3).lr_at(100), 0.3);
    }
}
