//! What a batch's sequence number says about the stream: apply it, skip a
//! duplicate, repair a gap, or start over after an engine restart.
//!
//! Publishers number batches from 0, one per batch, per process; a restart
//! starts at 0 again. A subscriber that joins late, or misses batches (PUB
//! drops at its high-water mark, a reconnect), sees a jump. Pure logic, so
//! every case is a unit test; the subscriber acts on the verdicts.

/// What to do with the batch numbered `seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The next batch: apply it.
    Apply,
    /// Already applied (a replayed batch the live stream also delivered).
    Duplicate,
    /// The first batch seen, and not the engine's first: batches
    /// `0..seq` happened before this subscriber joined.
    Joined,
    /// Batches `expected..seq` were lost.
    Gap {
        /// The first lost batch.
        from: u64,
    },
    /// The numbering went back: the engine restarted, and its cache with it.
    Restarted,
}

/// The last batch applied on one stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeqTracker {
    last: Option<u64>,
}

impl SeqTracker {
    /// The verdict on a live batch numbered `seq`.
    pub fn judge(&self, seq: u64) -> Verdict {
        match self.last {
            None if seq == 0 => Verdict::Apply,
            None => Verdict::Joined,
            Some(last) if seq == last.wrapping_add(1) => Verdict::Apply,
            Some(last) if seq > last => Verdict::Gap { from: last + 1 },
            // A live stream never repeats itself: going back (to 0, or to
            // anything below the last batch) is a new publisher process.
            Some(_) => Verdict::Restarted,
        }
    }

    /// The verdict on a replayed batch: anything not newer than the last
    /// applied one is a duplicate.
    pub fn judge_replayed(&self, seq: u64) -> Verdict {
        match self.last {
            Some(last) if seq <= last => Verdict::Duplicate,
            _ => Verdict::Apply,
        }
    }

    /// Records that batch `seq` was applied.
    pub fn applied(&mut self, seq: u64) {
        self.last = Some(seq);
    }

    /// The next batch expected.
    pub fn next(&self) -> u64 {
        self.last.map_or(0, |l| l.wrapping_add(1))
    }

    /// Forgets the stream's position (a restart).
    pub fn reset(&mut self) {
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_from_its_start_applies_in_order() {
        let mut t = SeqTracker::default();
        for seq in 0..5 {
            assert_eq!(t.judge(seq), Verdict::Apply);
            t.applied(seq);
        }
        assert_eq!(t.next(), 5);
    }

    #[test]
    fn joins_gaps_restarts_and_duplicates() {
        let mut t = SeqTracker::default();
        assert_eq!(t.judge(7), Verdict::Joined);
        t.applied(7);
        assert_eq!(t.judge(10), Verdict::Gap { from: 8 });
        assert_eq!(t.judge(0), Verdict::Restarted);
        assert_eq!(t.judge(3), Verdict::Restarted);
        assert_eq!(t.judge_replayed(7), Verdict::Duplicate);
        assert_eq!(t.judge_replayed(8), Verdict::Apply);
        t.reset();
        assert_eq!(t.judge(0), Verdict::Apply);
    }
}
