//! The calls of one connection waiting for replies (CLIENT-1, RESUME-1): the table the
//! connection task completes from and resends from, and its one way to fail them all.

use crate::ids::IdMap;
use crate::proto::v1::{Call, Received};
use crate::rpc::slot::Slot;
use crate::rpc::RpcError;
use crate::sync::lock;
use std::sync::{Arc, Mutex};

/// Calls waiting for replies, and whether the connection is gone (CLIENT-1).
#[derive(Default)]
pub(super) struct Pending {
    /// Each call with the message it went as, to send again on a resumed stream.
    pub(super) calls: IdMap<u64, (Arc<Slot>, Call)>,
    /// Calls fanned out by a relay (a host agent): one slot per worker, by proc.
    pub(super) fanned: IdMap<u64, (IdMap<u32, Arc<Slot>>, Call)>,
    pub(super) lost: Option<RpcError>,
    /// Replies received since the last message went out: the next one says so, and
    /// the worker forgets them (RESUME-1).
    pub(super) received: Vec<Received>,
}

impl Pending {
    /// The slot a reply completes (a fanned-out call's by the proc it names).
    pub(super) fn take(&mut self, call_id: u64, proc: Option<u32>) -> Option<Arc<Slot>> {
        self.received.push(Received { call_id, proc });
        let Some(proc) = proc else {
            return self.calls.remove(&call_id).map(|(slot, _)| slot);
        };
        let (slots, _) = self.fanned.get_mut(&call_id)?;
        let slot = slots.remove(&proc);
        if slots.is_empty() {
            self.fanned.remove(&call_id);
        }
        slot
    }

    /// Every call still waiting, in the order sent, marked as sent again (RESUME-1).
    pub(super) fn to_resend(&self) -> Vec<Call> {
        let mut msgs: Vec<Call> = self
            .calls
            .values()
            .map(|(_, m)| m)
            .chain(self.fanned.values().map(|(_, m)| m))
            .cloned()
            .collect();
        msgs.sort_by_key(|m| m.call_id);
        for m in &mut msgs {
            m.resent = true;
        }
        msgs
    }
}

/// Fails every pending call with the *first* cause of the loss (a later failure,
/// such as the send that finds the connection task gone, is a consequence of it).
pub(super) fn fail_all(pending: &Mutex<Pending>, err: RpcError) {
    let (calls, fanned, cause) = {
        let mut p = lock(pending);
        let cause = p.lost.get_or_insert(err).clone();
        (
            std::mem::take(&mut p.calls),
            std::mem::take(&mut p.fanned),
            cause,
        )
    };
    let fanned = fanned.into_values().flat_map(|(m, _)| m.into_values());
    for slot in calls.into_values().map(|(s, _)| s).chain(fanned) {
        slot.complete(Err(cause.clone()));
    }
}

/// Fails the fanned-out calls' slots of the workers `procs` with `err`, leaving the
/// connection and its other calls as they are (TREE-1). Whether any was waiting.
pub(super) fn fail_procs(pending: &Mutex<Pending>, procs: &[u32], err: &RpcError) -> bool {
    let mut failed = Vec::new();
    {
        let mut p = lock(pending);
        p.fanned.retain(|_, (slots, _)| {
            for proc in procs {
                if let Some(slot) = slots.remove(proc) {
                    failed.push(slot);
                }
            }
            !slots.is_empty()
        });
    }
    for slot in &failed {
        slot.complete(Err(err.clone()));
    }
    !failed.is_empty()
}
