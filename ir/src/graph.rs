//! The forward op graph as a petgraph DAG, built from a model's op list.
//!
//! Nodes are op indices (into `Model::ops`); an edge `a → b` means `b` reads `a`'s output.

use crate::model::Model;
use petgraph::graph::{DiGraph, NodeIndex};
use std::collections::HashMap;

pub struct OpGraph {
    pub graph: DiGraph<usize, ()>,
    pub nodes: Vec<NodeIndex>,
}

/// Builds the DAG; unknown references are skipped (validation reports them).
pub fn op_graph(model: &Model) -> OpGraph {
    let mut graph = DiGraph::with_capacity(model.ops.len(), model.ops.len() * 2);
    let nodes: Vec<_> = (0..model.ops.len()).map(|i| graph.add_node(i)).collect();
    let by_name: HashMap<&str, usize> = model
        .ops
        .iter()
        .enumerate()
        .map(|(i, o)| (o.name.as_str(), i))
        .collect();
    for (i, op) in model.ops.iter().enumerate() {
        for inp in &op.inputs {
            if let Some(&j) = by_name.get(inp.as_str()) {
                graph.add_edge(nodes[j], nodes[i], ());
            }
        }
    }
    OpGraph { graph, nodes }
}

impl OpGraph {
    /// A cycle's member op index, if the graph has one.
    pub fn find_cycle(&self) -> Option<usize> {
        petgraph::algo::toposort(&self.graph, None)
            .err()
            .map(|c| self.graph[c.node_id()])
    }

    /// Consumers (op indices) of each op's output.
    pub fn consumers(&self) -> Vec<Vec<usize>> {
        self.nodes
            .iter()
            .map(|&n| {
                let mut v: Vec<usize> = self
                    .graph
                    .neighbors_directed(n, petgraph::Direction::Outgoing)
                    .map(|m| self.graph[m])
                    .collect();
                v.sort_unstable();
                v.dedup();
                v
            })
            .collect()
    }
}
