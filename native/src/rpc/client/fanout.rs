//! A call to procs of a mesh across hosts: each proc by the path ORDER-1 allows
//! ([`Order`], `order.rs`), the procs of a host that go through its relay as one
//! message to it (RELAY-1), the others each on its own connection.
//!
//! TREE-1: beyond [`fanout_limit`] hosts, the hosts are cut into that many groups of
//! neighbours, and a call's part for a host goes to its group's head (the group's
//! first host whose relay is not known lost), which delivers its own host's part and
//! forwards each other host's part to that host's relay (`Delivery.via`,
//! `agent/relay.rs`), so the messages this process sends per call grow with the
//! number of groups, not of hosts. A host's part always takes the same route while
//! its head lives, so each path keeps its order (ORDER-1); replies come back the way
//! the call went, gathered in each relay's batches.
//!
//! A [`Fanout`] is made once per mesh (its hosts' relays, and which host runs each
//! proc); the ORDER-1 state it consults is this process's one for the mesh's token,
//! whichever `Fanout` sends.

use super::calls::Target;
use super::order::Order;
use super::WorkerConn;
use crate::proto::v1::Delivery;
use crate::rpc::slot::Slot;
use crate::rpc::RpcError;
use crate::sync::lock;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use tokio::runtime::Handle;

/// The ORDER-1 state of the mesh with `token` in this process: one per mesh, so the
/// calls of every actor mesh on it (and of every copy unpickled here) keep one order.
fn order_of(token: &str) -> Arc<Mutex<Order>> {
    static ORDERS: OnceLock<Mutex<HashMap<String, Arc<Mutex<Order>>>>> = OnceLock::new();
    let orders = ORDERS.get_or_init(Default::default);
    let mut map = lock(orders);
    map.entry(token.to_string()).or_default().clone()
}

/// The most messages one call sends to relays (TREE-1): 16, or `MONARCH_TREE_LIMIT`.
pub fn fanout_limit() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::env::var("MONARCH_TREE_LIMIT")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n: &usize| n >= 1)
            .unwrap_or(16)
    })
}

/// How many neighbouring hosts share a head when `hosts` hosts are called through at
/// most `limit` relays (1: no tree).
fn group_width(hosts: usize, limit: usize) -> usize {
    if hosts <= limit {
        1
    } else {
        hosts.div_ceil(limit)
    }
}

/// How a mesh's procs lie on its hosts, to send its calls by the paths ORDER-1 allows.
pub struct Fanout {
    token: String,
    /// Each host's relay (its agent's address), by host index.
    relays: Vec<String>,
    /// The index of the host that runs each proc, by proc rank (a proc on no host:
    /// host 0).
    host_of: Vec<usize>,
    /// TREE-1: how many neighbouring hosts share a head (1: each host is its own).
    width: usize,
    /// The mesh's ORDER-1 state ([`order_of`]): held from choosing the paths of a
    /// call until it is sent, so that the order of sending is the order chosen in.
    order: Arc<Mutex<Order>>,
}

/// What a call sends to one relay (TREE-1: a group's head): its deliveries, each
/// with the index of its proc in the call, and the other relays they name.
type HeadPart = (Vec<(usize, Delivery)>, Vec<String>);

/// One call sent to one proc.
#[derive(Clone)]
pub struct Sent {
    /// The call's id (shared by the procs of one message to a relay).
    pub call_id: u64,
    /// The slot its reply completes.
    pub slot: Arc<Slot>,
    /// The connection it went on: the worker's, or its host's relay's.
    pub conn: Arc<WorkerConn>,
    /// Through a relay: the index of the proc in the call (that of its connection
    /// in `conns`, for its address) and its proc rank.
    pub relayed: Option<(usize, u32)>,
}

impl Fanout {
    /// The fan-out of the mesh with `token` whose hosts are `hosts`: each one's relay
    /// address, first proc rank and number of procs.
    pub fn new(token: &str, hosts: &[(String, u32, u32)]) -> Fanout {
        let end = hosts
            .iter()
            .map(|h| h.1 as usize + h.2 as usize)
            .max()
            .unwrap_or(0);
        let mut host_of = vec![0; end];
        // The first host that has a proc is its host: the later ones are written first.
        for (i, (_, first, n)) in hosts.iter().enumerate().rev() {
            for slot in &mut host_of[*first as usize..*first as usize + *n as usize] {
                *slot = i;
            }
        }
        Fanout {
            token: token.to_string(),
            relays: hosts.iter().map(|h| h.0.clone()).collect(),
            host_of,
            width: group_width(hosts.len(), fanout_limit()),
            order: order_of(token),
        }
    }

    fn host_of(&self, proc: u32) -> usize {
        self.host_of.get(proc as usize).copied().unwrap_or(0)
    }

    /// TREE-1: the host whose relay takes `host`'s part of a call: the first host of
    /// its group whose relay is not known lost (`host` itself without a tree).
    fn head_of(&self, host: usize) -> usize {
        if self.width == 1 {
            return host;
        }
        let start = host - host % self.width;
        let end = (start + self.width).min(self.relays.len());
        (start..end)
            .find(|&h| !WorkerConn::relay_lost(&self.relays[h], &self.token))
            .unwrap_or(start)
    }

    /// Sends one call of `target` to `procs`, each by its path: `conns[i]` is the
    /// connection to `procs[i]`'s worker, `ranks[i]` its index within the called mesh.
    /// Returns the calls sent, in the order of `procs` (none for a broadcast).
    pub fn send(
        &self,
        rt: &Handle,
        target: &Target<'_>,
        conns: &[Arc<WorkerConn>],
        procs: &[u32],
        ranks: &[u32],
    ) -> Result<Vec<Sent>, RpcError> {
        let hosts: Vec<usize> = procs.iter().map(|&p| self.host_of(p)).collect();
        let mut out: Vec<Option<Sent>> = procs.iter().map(|_| None).collect();
        let mut order = lock(&self.order);
        // The relayed parts, by the relay they go to (TREE-1: a group's head), and the
        // other relays its deliveries name (`Delivery.via`: 1 + an index in them).
        let mut by_head: BTreeMap<usize, HeadPart> = BTreeMap::new();
        for part in order.plan(procs, &hosts, self.relays.len(), target.oneway) {
            // CLIENT-3: a lost connection is never used for a new call.
            let direct = part
                .direct
                .iter()
                .map(|&i| conns[i].current(rt))
                .collect::<Result<Vec<_>, _>>()?;
            for (&i, conn) in part.direct.iter().zip(direct) {
                let (call_id, slot) = conn.call(target, ranks[i]);
                order.sent_direct(procs[i], slot.as_ref()); // (None: a broadcast)
                if let Some(slot) = slot {
                    out[i] = Some(Sent {
                        call_id,
                        slot,
                        conn,
                        relayed: None,
                    });
                }
            }
            if part.relayed.is_empty() {
                continue;
            }
            if part.host >= self.relays.len() {
                return Err(RpcError::Address(format!(
                    "no relay for host {}",
                    part.host
                )));
            }
            let head = self.head_of(part.host);
            let (parts, vias) = by_head.entry(head).or_default();
            // (each host is one part of a call: its relay is named once)
            let via = if head == part.host {
                0
            } else {
                vias.push(self.relays[part.host].clone());
                vias.len() as u32
            };
            parts.extend(part.relayed.iter().map(|&i| {
                let d = Delivery {
                    proc: procs[i],
                    rank: ranks[i],
                    via,
                };
                (i, d)
            }));
        }
        for (head, (parts, vias)) in by_head {
            let relay = WorkerConn::relay(rt, &self.relays[head], &self.token)?;
            let (idx, deliveries): (Vec<usize>, Vec<Delivery>) = parts.into_iter().unzip();
            let (call_id, slots) = relay.call_fanned(target, deliveries, vias);
            if target.oneway {
                for &i in &idx {
                    order.sent_relayed(procs[i], None);
                }
            }
            for (&i, slot) in idx.iter().zip(slots) {
                order.sent_relayed(procs[i], Some(&slot));
                out[i] = Some(Sent {
                    call_id,
                    slot,
                    conn: relay.clone(),
                    relayed: Some((i, procs[i])),
                });
            }
        }
        Ok(out.into_iter().flatten().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_proc_is_on_the_first_host_that_has_it_and_one_on_none_on_host_0() {
        let hosts = [("a:1".to_string(), 0, 2), ("b:1".to_string(), 2, 3)];
        let f = Fanout::new("fanout-test-token", &hosts);
        let got: Vec<usize> = (0..7).map(|p| f.host_of(p)).collect();
        assert_eq!(got, vec![0, 0, 1, 1, 1, 0, 0]);
        assert_eq!(f.relays, vec!["a:1", "b:1"]);
    }

    #[test]
    fn the_fan_outs_of_one_token_share_one_order() {
        let a = Fanout::new("fanout-shared-token", &[]);
        let b = Fanout::new("fanout-shared-token", &[]);
        let c = Fanout::new("fanout-other-token", &[]);
        assert!(Arc::ptr_eq(&a.order, &b.order));
        assert!(!Arc::ptr_eq(&a.order, &c.order));
    }

    #[test]
    fn hosts_beyond_the_limit_share_heads_so_a_call_sends_at_most_the_limit() {
        assert_eq!(group_width(16, 16), 1);
        assert_eq!(group_width(17, 16), 2);
        assert_eq!(group_width(64, 16), 4);
        assert_eq!(group_width(1024, 16), 64);
        for hosts in 1..300 {
            let w = group_width(hosts, 16);
            assert!(hosts.div_ceil(w) <= 16, "{hosts} hosts in groups of {w}");
        }
        let hosts: Vec<(String, u32, u32)> = (0..64)
            .map(|i| (format!("10.0.0.{i}:1"), i * 16, 16))
            .collect();
        let f = Fanout::new("fanout-tree-token", &hosts);
        let heads: std::collections::BTreeSet<usize> = (0..64).map(|h| f.head_of(h)).collect();
        assert_eq!(heads.len(), 16);
        assert_eq!(
            (f.head_of(0), f.head_of(3), f.head_of(4), f.head_of(63)),
            (0, 0, 4, 60)
        );
    }
}
