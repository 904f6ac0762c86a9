//! Which path each call from this process to a worker of a mesh across hosts takes:
//! direct, on the worker's own connection, or through its host's agent (the relay,
//! RELAY-1). The rule and nothing else: no sockets, only the slots of the calls sent.
//!
//! ORDER-1: calls from this process to one worker arrive in the order they were sent,
//! whichever path each takes. Each path keeps its own order (one stream each, and the
//! relay delivers a caller's calls to a worker in the order they come), so a worker
//! switches to the other path only when nothing sent on the first can still arrive
//! after: every call sent there has been answered (and so has run), and a broadcast
//! sent there has been followed there by a call that was answered (a broadcast has no
//! reply of its own). Within that rule, a call to one proc of a host goes direct (one
//! hop, the latency of a call on one host) and a call to several procs of a host goes
//! through its relay (one message per host). A broadcast goes through the relays,
//! but to a worker whose direct path is still busy it goes direct, behind the calls
//! there (one message per such worker), and holds the worker on that path until a
//! direct call after it is answered: the mirror of the relay's rule.
//!
//! [`Order`] keeps, for each worker of one mesh, what its calls still hold it to; the
//! fan-out ([`Fanout`](super::Fanout)) asks it for every call's paths and tells it what
//! it sent, under one lock, so the paths and the order of sending agree.

use crate::rpc::slot::Slot;
use std::collections::VecDeque;
use std::sync::{Arc, Weak};

/// The path of a call to one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// On the worker's own connection.
    Direct,
    /// Through its host's relay.
    Relay,
}

/// One host's part of a call: indices into the call's procs, by path.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct HostPart {
    /// The host's index.
    pub host: usize,
    /// The procs that go direct.
    pub direct: Vec<usize>,
    /// The procs that go through the host's relay.
    pub relayed: Vec<usize>,
}

/// Whether a call is answered. Its slot is held weakly: one nobody holds any more has
/// been let go by its connection, which happens only once it completes (or with the
/// connection, when nothing can arrive on it any more), and the reply's own lifetime
/// is its caller's (a reply nobody holds frees what was pulled for it: XFER-2).
fn answered(call: &Weak<Slot>) -> bool {
    call.upgrade().is_none_or(|s| s.is_done())
}

/// Whether any of `calls` (oldest first) is unanswered. The answered ones before the
/// oldest unanswered are forgotten, and the check stops there: replies mostly come in
/// the order sent, so a worker with many calls in flight costs a look or two per
/// call, not one per call in flight.
fn unanswered(calls: &mut VecDeque<Weak<Slot>>) -> bool {
    while let Some(oldest) = calls.front() {
        if !answered(oldest) {
            return true;
        }
        calls.pop_front();
    }
    false
}

/// A broadcast sent on one path, until it is known to have run.
enum Broadcast {
    /// No call on that path since.
    Unfollowed,
    /// The first call sent on that path after it: answered, the broadcast has run.
    FollowedBy(Weak<Slot>),
}

/// What one path of one worker still holds: its calls not known answered (oldest
/// first), and its last broadcast until it is known to have run.
#[derive(Default)]
struct OnPath {
    calls: VecDeque<Weak<Slot>>,
    broadcast: Option<Broadcast>,
}

impl OnPath {
    /// Whether something sent on this path may still arrive.
    fn busy(&mut self) -> bool {
        match &self.broadcast {
            Some(Broadcast::Unfollowed) => return true,
            Some(Broadcast::FollowedBy(c)) if !answered(c) => return true,
            Some(Broadcast::FollowedBy(_)) => self.broadcast = None,
            None => {}
        }
        unanswered(&mut self.calls)
    }

    /// Records a call sent on this path (None: a broadcast).
    fn sent(&mut self, call: Option<&Arc<Slot>>) {
        match call {
            None => self.broadcast = Some(Broadcast::Unfollowed),
            Some(call) => {
                self.calls.push_back(Arc::downgrade(call));
                if matches!(self.broadcast, Some(Broadcast::Unfollowed)) {
                    self.broadcast = Some(Broadcast::FollowedBy(Arc::downgrade(call)));
                }
            }
        }
    }

    fn is_clear(&self) -> bool {
        self.calls.is_empty() && self.broadcast.is_none()
    }
}

/// What one worker's calls still hold it to, on each path.
#[derive(Default)]
struct Held {
    direct: OnPath,
    relayed: OnPath,
}

impl Held {
    fn is_clear(&self) -> bool {
        self.direct.is_clear() && self.relayed.is_clear()
    }
}

/// The ORDER-1 state of one mesh's workers in this process, by proc rank.
#[derive(Default)]
pub struct Order {
    /// What holds each worker, by proc rank (a clear entry: free to take either
    /// path). Entries stay, with their queues' room, once made: a call to 1,024 procs
    /// records 1,024 calls and the next finds them answered, with no allocation
    /// either way (a map of only the held workers made and dropped 1,024 per call).
    held: Vec<Held>,
}

impl Order {
    /// The path of a call to worker `proc`; `alone`: whether it is the only proc of
    /// its host this call goes to; `oneway`: a broadcast (the relay, unless the
    /// worker's direct path is busy).
    pub fn path(&mut self, proc: u32, alone: bool, oneway: bool) -> Path {
        let free = if alone && !oneway {
            Path::Direct
        } else {
            Path::Relay
        };
        let Some(held) = self.held.get_mut(proc as usize) else {
            return free;
        };
        if held.is_clear() {
            return free;
        }
        // (only one path is ever busy: a worker leaves one only once it is clear)
        if held.relayed.busy() {
            Path::Relay
        } else if held.direct.busy() {
            Path::Direct
        } else {
            free
        }
    }

    /// `proc`'s entry, made (clear) if it has none yet.
    fn held_mut(&mut self, proc: u32) -> &mut Held {
        let i = proc as usize;
        if i >= self.held.len() {
            self.held.resize_with(i + 1, Held::default);
        }
        &mut self.held[i]
    }

    /// Whether no worker is held (every call answered).
    #[cfg(test)]
    fn all_clear(&self) -> bool {
        self.held.iter().all(Held::is_clear)
    }

    /// The paths of one call to `procs`, whose hosts are `hosts` (`hosts[i]`: the index
    /// of `procs[i]`'s host, below `n_hosts`): one part per host, in the order the
    /// hosts first appear in `procs`.
    pub fn plan(
        &mut self,
        procs: &[u32],
        hosts: &[usize],
        n_hosts: usize,
        oneway: bool,
    ) -> Vec<HostPart> {
        // Each host's part, by host index, then each proc's path: whether a proc is
        // alone on its host is known only once every proc is placed.
        let mut index: Vec<Option<usize>> = vec![None; n_hosts];
        let mut parts: Vec<(usize, Vec<usize>)> = Vec::new();
        for (i, &h) in hosts.iter().enumerate() {
            let slot = match index.get(h).copied().flatten() {
                Some(slot) => slot,
                None => {
                    parts.push((h, Vec::new()));
                    if let Some(entry) = index.get_mut(h) {
                        *entry = Some(parts.len() - 1);
                    }
                    parts.len() - 1
                }
            };
            parts[slot].1.push(i);
        }
        parts
            .into_iter()
            .map(|(host, members)| {
                let alone = members.len() == 1;
                let mut part = HostPart {
                    host,
                    ..HostPart::default()
                };
                for i in members {
                    match self.path(procs[i], alone, oneway) {
                        Path::Direct => part.direct.push(i),
                        Path::Relay => part.relayed.push(i),
                    }
                }
                part
            })
            .collect()
    }

    /// Records a call sent direct to `proc`; `call`: the slot its reply completes,
    /// None for a broadcast.
    pub fn sent_direct(&mut self, proc: u32, call: Option<&Arc<Slot>>) {
        self.held_mut(proc).direct.sent(call);
    }

    /// Records a call sent to `proc` through its relay; `call`: the slot its reply
    /// completes, None for a broadcast.
    pub fn sent_relayed(&mut self, proc: u32, call: Option<&Arc<Slot>>) {
        self.held_mut(proc).relayed.sent(call);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::v1::Reply;

    fn answer(call: &Arc<Slot>) {
        call.complete(Ok(Reply::default()));
    }

    /// Sends one call to `procs` (hosts `hosts` of 2) as the fan-out does: the plan,
    /// then a new slot for each proc recorded on its path; the slots by proc index.
    fn send(
        order: &mut Order,
        procs: &[u32],
        hosts: &[usize],
        oneway: bool,
    ) -> (Vec<HostPart>, Vec<Option<Arc<Slot>>>) {
        let plan = order.plan(procs, hosts, 2, oneway);
        let mut slots = vec![None; procs.len()];
        for part in &plan {
            for &i in &part.direct {
                if oneway {
                    order.sent_direct(procs[i], None);
                } else {
                    let s = Slot::new();
                    order.sent_direct(procs[i], Some(&s));
                    slots[i] = Some(s);
                }
            }
            for &i in &part.relayed {
                if oneway {
                    order.sent_relayed(procs[i], None);
                } else {
                    let s = Slot::new();
                    order.sent_relayed(procs[i], Some(&s));
                    slots[i] = Some(s);
                }
            }
        }
        (plan, slots)
    }

    fn part(host: usize, direct: &[usize], relayed: &[usize]) -> HostPart {
        HostPart {
            host,
            direct: direct.to_vec(),
            relayed: relayed.to_vec(),
        }
    }

    #[test]
    fn one_proc_of_a_host_goes_direct_and_several_through_the_relay() {
        let mut order = Order::default();
        // procs 0, 1 on host 0; 2 on host 1: host 0's part first, as its procs come first.
        let (plan, slots) = send(&mut order, &[0, 2, 1], &[0, 1, 0], false);
        assert_eq!(plan, vec![part(0, &[], &[0, 2]), part(1, &[1], &[])]);
        slots.iter().flatten().for_each(answer);
        // All answered: each worker is free again.
        let (plan, _) = send(&mut order, &[1], &[0], false);
        assert_eq!(plan, vec![part(0, &[0], &[])]);
    }

    #[test]
    fn a_worker_with_an_unanswered_relayed_call_stays_on_the_relay() {
        let mut order = Order::default();
        let (_, slots) = send(&mut order, &[0, 1], &[0, 0], false);
        assert_eq!(order.path(0, true, false), Path::Relay);
        answer(slots[1].as_ref().unwrap());
        assert_eq!(
            order.path(0, true, false),
            Path::Relay,
            "proc 0's call is unanswered"
        );
        assert_eq!(
            order.path(1, true, false),
            Path::Direct,
            "proc 1's call is answered"
        );
        answer(slots[0].as_ref().unwrap());
        assert_eq!(order.path(0, true, false), Path::Direct);
    }

    #[test]
    fn a_worker_with_an_unanswered_direct_call_stays_direct() {
        let mut order = Order::default();
        let (_, one) = send(&mut order, &[0], &[0], false);
        // A call to both procs of the host: proc 0 goes direct, behind its own call.
        let (plan, both) = send(&mut order, &[0, 1], &[0, 0], false);
        assert_eq!(plan, vec![part(0, &[0], &[1])]);
        answer(one[0].as_ref().unwrap());
        assert_eq!(
            order.path(0, false, false),
            Path::Direct,
            "its second direct call is unanswered"
        );
        answer(both[0].as_ref().unwrap());
        assert_eq!(order.path(0, false, false), Path::Relay);
    }

    #[test]
    fn a_worker_is_held_while_any_call_is_unanswered_whatever_order_the_replies_come_in() {
        let mut order = Order::default();
        let (_, first) = send(&mut order, &[0], &[0], false);
        let (_, second) = send(&mut order, &[0], &[0], false);
        answer(second[0].as_ref().unwrap());
        assert_eq!(
            order.path(0, false, false),
            Path::Direct,
            "the first is unanswered"
        );
        answer(first[0].as_ref().unwrap());
        assert_eq!(order.path(0, false, false), Path::Relay);
    }

    #[test]
    fn a_broadcast_goes_through_the_relay_even_to_one_proc() {
        let mut order = Order::default();
        let (plan, slots) = send(&mut order, &[3], &[1], true);
        assert_eq!(plan, vec![part(1, &[], &[0])]);
        assert!(
            slots.iter().all(Option::is_none),
            "a broadcast has no replies"
        );
    }

    #[test]
    fn after_a_broadcast_a_worker_stays_on_the_relay_until_a_relayed_call_after_it_is_answered() {
        let mut order = Order::default();
        send(&mut order, &[0, 1], &[0, 0], true);
        // Nothing after the broadcast yet: the relay, however long it has been.
        assert_eq!(order.path(0, true, false), Path::Relay);
        let (_, after) = send(&mut order, &[0], &[0], false);
        let (_, later) = send(&mut order, &[0], &[0], false);
        answer(later[0].as_ref().unwrap());
        assert_eq!(
            order.path(0, true, false),
            Path::Relay,
            "the call just after the broadcast is unanswered"
        );
        answer(after[0].as_ref().unwrap());
        assert_eq!(order.path(0, true, false), Path::Direct);
        // Proc 1 got the broadcast too, and nothing after it.
        assert_eq!(order.path(1, true, false), Path::Relay);
    }

    #[test]
    fn a_broadcast_to_a_worker_with_an_unanswered_direct_call_goes_direct_behind_it() {
        let mut order = Order::default();
        // A call to proc 0 alone: direct.
        let (_, one) = send(&mut order, &[0], &[0], false);
        // The broadcast to both procs of host 0: proc 0's direct path is busy, so its
        // copy goes direct, behind that call; proc 1's goes through the relay.
        let (plan, _) = send(&mut order, &[0, 1], &[0, 0], true);
        assert_eq!(plan, vec![part(0, &[0], &[1])]);
        answer(one[0].as_ref().unwrap());
        // The call before it is answered, but the broadcast may not have run: proc 0
        // stays direct, even for a call to the whole host...
        assert_eq!(order.path(0, false, false), Path::Direct);
        let (plan, after) = send(&mut order, &[0, 1], &[0, 0], false);
        assert_eq!(plan, vec![part(0, &[0], &[1])]);
        // ...until a direct call after the broadcast is answered.
        answer(after[0].as_ref().unwrap());
        assert_eq!(order.path(0, false, false), Path::Relay);
    }

    #[test]
    fn a_second_broadcast_needs_a_call_after_it_too() {
        let mut order = Order::default();
        send(&mut order, &[0], &[0], true);
        let (_, after) = send(&mut order, &[0], &[0], false);
        send(&mut order, &[0], &[0], true);
        answer(after[0].as_ref().unwrap());
        assert_eq!(
            order.path(0, true, false),
            Path::Relay,
            "the second broadcast is unfollowed"
        );
        let (_, after2) = send(&mut order, &[0], &[0], false);
        answer(after2[0].as_ref().unwrap());
        assert_eq!(order.path(0, true, false), Path::Direct);
    }

    #[test]
    fn a_call_nobody_holds_any_more_counts_as_answered() {
        let mut order = Order::default();
        let (_, slots) = send(&mut order, &[0], &[0], false);
        assert_eq!(order.path(0, false, false), Path::Direct);
        drop(slots); // its connection let go of it (it completed) and so did its caller
        assert_eq!(order.path(0, false, false), Path::Relay);
        assert!(order.all_clear());
    }

    #[test]
    fn a_failed_call_counts_as_answered() {
        let mut order = Order::default();
        let (_, slots) = send(&mut order, &[0, 1], &[0, 0], false);
        for s in slots.iter().flatten() {
            s.complete(Err(crate::rpc::RpcError::Io("gone".into())));
        }
        assert_eq!(order.path(0, true, false), Path::Direct);
    }

    #[test]
    fn calls_made_without_waiting_keep_to_the_relay_after_a_broadcast_then_go_direct_once_answered()
    {
        // As tests/multihost's order test: procs 0, 1 on host 0 and 2, 3 on host 1;
        // rounds of a broadcast, a call to proc 2, a call to all, a call to proc 2.
        let (all, hosts): (&[u32], &[usize]) = (&[0, 1, 2, 3], &[0, 0, 1, 1]);
        let mut order = Order::default();
        let mut slots = Vec::new();
        for _ in 0..3 {
            send(&mut order, all, hosts, true);
            for (procs, hosts) in [(&[2][..], &[1][..]), (all, hosts), (&[2], &[1])] {
                let (plan, sent) = send(&mut order, procs, hosts, false);
                assert!(plan.iter().all(|p| p.direct.is_empty()), "{plan:?}");
                slots.extend(sent.into_iter().flatten());
            }
        }
        slots.iter().for_each(answer);
        let (plan, _) = send(&mut order, &[2], &[1], false);
        assert_eq!(plan, vec![part(1, &[0], &[])]);
    }
}
