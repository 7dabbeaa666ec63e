//! What this node tells its peers: one transcript of what they were told, and
//! rounds built once and written on every link.
//!
//! A round (on a bell announcement, at most one per push gap, and at least
//! every sync interval) reads the entries whose change flag is set, the
//! polled flags and snapshots, compares them with the transcript and encodes
//! what changed once, with this node's own worker-set writes since the
//! last round (and, once per anti-entropy interval, the worker-set digest:
//! see `worker_set`); every link writes the same bytes.
//! A round costs one read per changed entry and one encode whatever the
//! number of peers. (Before, each link read every key and encoded its own
//! frames for every push: at 64 replicas a change cost 63 walks of every
//! key and 63 encodes — see `benches/scale`.)
//!
//! Each round also carries a slice of the transcript unchanged, the rolling
//! refresh: every entry is re-sent once per anti-entropy interval, so a
//! receiver keeps what is live (it forgets entries nobody refreshes) and
//! heals anything it lost, as an even trickle shared by all links rather
//! than a full copy per link in a burst.
//!
//! A link that starts, or falls more than [`ROUNDS_BUFFERED`] rounds
//! behind, gets the transcript itself — what every peer was told as of the last
//! round, in that round's number — then the rounds after it. Entries are
//! absolute values ordered by round, so the transcript plus the later rounds
//! leaves that peer where every other one is. (A copy of the *current*
//! values would not: a value that changed and changed back between two
//! rounds would reach one peer and never be corrected.)
//!
//! A round's slots go out packed: per worker, only the fields that differ
//! from the transcript (see `shoal_proto::slot_pack`; the receiver's
//! `heard` holds what its stream said). The transcript copy is always
//! whole values, and while any link's peer has not said it reads packed
//! updates (a build from before them, or a link whose peer has not
//! spoken yet) each round is also encoded whole for it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use shoal_proto::LoadCounts;
use shoal_proto::frames::{FrameError, WorkerSetEntry};
use tokio::sync::broadcast;

mod batch;

use batch::{Batch, emit_changes};

use crate::core::Core;
use crate::identity::unix_micros;
use crate::slot::WorkerEntry;
use crate::state::SnapshotValue;
use crate::worker_frames;

/// Rounds a link may fall behind before it is sent the transcript instead (at
/// the shortest push gap, about four seconds of rounds).
pub(crate) const ROUNDS_BUFFERED: usize = 1024;

/// One round in this many carries the read time the receiver's lag
/// histogram needs (0, one byte on the wire, in the others).
const LAG_SAMPLE_EVERY: u64 = 8;

/// What the peers were told about one wire id.
#[derive(Debug, Clone, Copy)]
struct Told {
    /// The entry the id named (ids are reused after a removal).
    serial: u64,
    polled: bool,
    slot: Option<LoadCounts>,
    basis_ms: u64,
    snapshot: Option<(u64, SnapshotValue)>,
}

/// What every peer was told, as of the last round.
#[derive(Debug, Default)]
struct Transcript {
    /// By wire id (bounded by the most keys this node held at once).
    told: Vec<Option<Told>>,
    /// Sequence of the last round built: a link skips rounds at or below
    /// the sequence of the transcript copy it was sent.
    seq: u64,
    /// Wire round (the LWW version) of the last round with entries.
    round: u64,
    /// When the last round read the slots (µs since the Unix epoch).
    last_read_us: u64,
    /// When the last worker-set digest went out (or the first round was
    /// built): the next is due an anti-entropy interval later.
    digest_since: Option<Instant>,
    /// Registry position the rolling refresh continues from.
    refresh_at: usize,
    /// Entries the refresh owes (fractional, carried between rounds).
    refresh_owed: f64,
    last_round_at: Option<Instant>,
}

impl Transcript {
    fn told(&self, entry: &WorkerEntry) -> Option<Told> {
        self.told
            .get(entry.id as usize)
            .copied()
            .flatten()
            .filter(|t| t.serial == entry.serial)
    }

    fn set(&mut self, entry: &WorkerEntry, told: Told) {
        let id = entry.id as usize;
        if self.told.len() <= id {
            self.told.resize(id + 1, None);
        }
        self.told[id] = Some(told);
    }

    /// Where the rolling refresh stands, to undo a round that failed.
    fn refresh_state(&self) -> (usize, f64, Option<Instant>) {
        (self.refresh_at, self.refresh_owed, self.last_round_at)
    }

    fn restore_refresh(&mut self, (at, owed, last): (usize, f64, Option<Instant>)) {
        self.refresh_at = at;
        self.refresh_owed = owed;
        self.last_round_at = last;
    }

    /// How many entries this round's refresh re-sends, and from where.
    fn refresh_slice(&mut self, now: Instant, live: usize, every: Duration) -> (usize, usize) {
        let owed = match self.last_round_at {
            Some(last) => {
                self.refresh_owed
                    + live as f64 * now.saturating_duration_since(last).as_secs_f64()
                        / every.as_secs_f64().max(1e-3)
            }
            None => 0.0,
        };
        self.last_round_at = Some(now);
        // Refreshes wait until a batch is owed: one entry owed per round
        // would make every heartbeat a packet on every link.
        let batch = REFRESH_MIN_BATCH.min(live).max(1) as f64;
        let count = if owed >= batch {
            (owed.floor() as usize).min(live)
        } else {
            0
        };
        self.refresh_owed = (owed - count as f64).min(live as f64);
        let start = if live == 0 { 0 } else { self.refresh_at % live };
        self.refresh_at = start + count;
        (start, count)
    }
}

/// Fewest entries a round's refresh carries (all of them when fewer are
/// live): at 1,000 workers and a 30 s interval, about one refresh packet
/// per link a second instead of one with every 20 ms heartbeat.
const REFRESH_MIN_BATCH: usize = 32;

/// One round as every link sends it.
#[derive(Debug)]
pub(crate) struct Round {
    /// Sequence number (every round, with entries or not, takes one).
    pub(crate) seq: u64,
    /// Length-prefixed frames, encoded once, slot changes packed.
    pub(crate) frames: Vec<Vec<u8>>,
    /// The same round with whole-value updates, for links whose peer has
    /// not said it reads packed ones; built only while such a link is up.
    /// `None` with `packed` false: `frames` serve every link.
    pub(crate) legacy: Option<Vec<Vec<u8>>>,
    /// `frames` hold a packed update.
    pub(crate) packed: bool,
    /// Bytes of those that are worker-set frames (for the byte counter).
    pub(crate) set_bytes: usize,
}

impl Round {
    /// The frames a link sends: packed if its peer reads them. `None` if
    /// the round was built without the whole-value form that link needs
    /// (it then resyncs from a transcript copy).
    pub(crate) fn frames_for(&self, peer_packs: bool) -> Option<&[Vec<u8>]> {
        if peer_packs || !self.packed {
            Some(&self.frames)
        } else {
            self.legacy.as_deref()
        }
    }
}

/// What a new (or resynced) link is sent first.
#[derive(Debug)]
pub(crate) struct TranscriptCopy {
    /// The transcript's frames, then the whole worker set's.
    pub(crate) frames: Vec<Vec<u8>>,
    /// Bytes of the worker-set frames among them.
    pub(crate) set_bytes: usize,
    /// The sequence after which the link's rounds continue.
    pub(crate) upto: u64,
}

/// A round's frames before they are sent.
struct Encoded {
    /// Packed updates, then the rest.
    frames: Vec<Vec<u8>>,
    /// Whole-value updates, then the rest, if asked for.
    legacy: Option<Vec<Vec<u8>>>,
    packed: bool,
    set_bytes: usize,
    /// The wire round of its updates, if it has any.
    round: Option<u64>,
    digest_sent: bool,
}

/// The node's transcript and its stream of rounds.
#[derive(Debug)]
pub(crate) struct Outbox {
    transcript: Mutex<Transcript>,
    rounds: broadcast::Sender<Arc<Round>>,
    /// Every transcript entry is re-sent once per this interval.
    refresh_every: Duration,
    /// Links up whose peer has not said it reads packed updates: while
    /// there is one, rounds are also encoded with whole values.
    whole_links: AtomicUsize,
}

impl Outbox {
    pub(crate) fn new(refresh_every: Duration) -> Self {
        Self {
            transcript: Mutex::new(Transcript::default()),
            rounds: broadcast::channel(ROUNDS_BUFFERED).0,
            refresh_every,
            whole_links: AtomicUsize::new(0),
        }
    }

    /// Counts a link as needing whole-value rounds until the guard is
    /// released (its peer said it packs) or dropped. Take it before
    /// [`Outbox::subscribe`]: every round the link is fed is then built
    /// with the whole-value form.
    pub(crate) fn whole_link(&self) -> WholeLink<'_> {
        self.whole_links.fetch_add(1, Ordering::SeqCst);
        WholeLink {
            outbox: self,
            held: true,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Transcript> {
        self.transcript.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A link's feed of rounds; take it before [`Outbox::transcript_copy`].
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<Round>> {
        self.rounds.subscribe()
    }

    /// Every entry of the transcript is re-sent once per this interval, and
    /// the worker-set digest goes out as often.
    pub(crate) fn refresh_every(&self) -> Duration {
        self.refresh_every
    }

    /// What every peer was told as of the last round, as frames in that
    /// round's number, with the whole worker set (whatever this node's
    /// rounds carry later is newer or the same).
    pub(crate) fn transcript_copy(&self, core: &Core) -> Result<TranscriptCopy, FrameError> {
        let transcript = self.lock();
        let mut batch = Batch::default();
        for entry in core.worker_keys.list().iter() {
            if let Some(told) = transcript.told(entry) {
                batch.all_of(entry, &told);
            }
        }
        let mut frames = batch.encode(transcript.round, 0)?;
        let set = worker_frames::entries(&core.worker_set.lock().to_entries())?;
        frames.extend(set.frames);
        // Tenant usage is not diffed against the transcript: its current
        // values (newer than or equal to the last round's) go out whole,
        // and later rounds carry only what changes after them.
        frames.extend(core.tenants.full_frames(crate::identity::unix_secs())?);
        Ok(TranscriptCopy {
            frames,
            set_bytes: set.bytes,
            upto: transcript.seq,
        })
    }

    /// Builds the next round — what changed since the last one, plus the
    /// refresh slice — and hands it to every link. Rounds with nothing in
    /// them are not sent (they still take a sequence number). The transcript
    /// records only what was encoded: if encoding fails, the round's
    /// changes stay flagged for the next one.
    pub(crate) fn round(&self, core: &Core) -> Result<(), FrameError> {
        let mut transcript = self.lock();
        let entries = core.worker_keys.list();
        let refresh_before = transcript.refresh_state();
        let (refresh_start, refresh_count) =
            transcript.refresh_slice(Instant::now(), entries.len(), self.refresh_every);
        let refreshed = |pos: usize| {
            let live = entries.len().max(1);
            (pos + live - refresh_start % live) % live < refresh_count
        };
        let read_at = unix_micros();
        let mut batch = Batch::default();
        let mut told_now: Vec<(&WorkerEntry, Told)> = Vec::new();
        for (pos, entry) in entries.iter().enumerate() {
            if entry.id == u32::MAX {
                continue;
            }
            let prev = transcript.told(entry);
            // Only an entry whose flag is set can differ from the transcript.
            let changed = if entry.take_changed() {
                changes(entry, prev.as_ref())
            } else {
                None
            };
            match (changed, prev) {
                (Some(next), _) => {
                    emit_changes(&mut batch, entry, prev.as_ref(), &next);
                    told_now.push((entry, next));
                }
                (None, Some(told)) if refreshed(pos) => batch.all_of(entry, &told),
                _ => {}
            }
        }
        let now = Instant::now();
        let digest_since = *transcript.digest_since.get_or_insert(now);
        let digest_due = now.saturating_duration_since(digest_since) >= self.refresh_every;
        let own_writes = core.worker_set.lock().take_own_changes();
        // Sightings and objects are outside the transcript (taken from their
        // queues here), encoded before the transcript records the round: a
        // failure then leaves nothing recorded as said that no peer was
        // sent (packed changes lean on the transcript being what peers
        // heard).
        let encoded = self
            .encode_round(core, &transcript, batch, &own_writes, digest_due)
            .and_then(|encoded| {
                let others: Vec<Vec<u8>> = core
                    .sightings
                    .frames()?
                    .into_iter()
                    .chain(core.objects.frames()?)
                    .chain(core.tenants.frames(read_at / 1_000_000)?)
                    .collect();
                Ok((encoded, others))
            });
        let (encoded, others) = match encoded {
            Ok(encoded) => encoded,
            Err(e) => {
                for (entry, _) in &told_now {
                    entry.keep_changed();
                }
                core.worker_set.lock().restore_own_changes(&own_writes);
                transcript.restore_refresh(refresh_before);
                return Err(e);
            }
        };
        for (entry, next) in told_now {
            transcript.set(entry, next);
        }
        if let Some(round) = encoded.round {
            transcript.round = round;
        }
        if encoded.digest_sent {
            transcript.digest_since = Some(now);
        }
        transcript.last_read_us = read_at;
        transcript.seq += 1;
        let seq = transcript.seq;
        let mut frames = encoded.frames;
        let mut legacy = encoded.legacy;
        if let Some(legacy) = &mut legacy {
            legacy.extend(others.iter().cloned());
        }
        frames.extend(others);
        if !frames.is_empty() {
            // No receiver (no link up) is not an error: the transcript holds it.
            let _ = self.rounds.send(Arc::new(Round {
                seq,
                frames,
                legacy,
                packed: encoded.packed,
                set_bytes: encoded.set_bytes,
            }));
        }
        Ok(())
    }

    /// The frames of a round: its updates (stamped with a new wire round
    /// if there are any), this node's own worker-set writes, and the
    /// digest when it is due. Changes nothing in the transcript.
    fn encode_round(
        &self,
        core: &Core,
        transcript: &Transcript,
        batch: Batch,
        own_writes: &[WorkerSetEntry],
        digest_due: bool,
    ) -> Result<Encoded, FrameError> {
        let mut frames = Vec::new();
        let mut legacy = None;
        let mut round = None;
        let packed = !batch.is_empty();
        if packed {
            let next = core.round.fetch_add(1, Ordering::Relaxed) + 1;
            // The lag histogram needs one sample in a few rounds, not
            // eight bytes in every one.
            let prev_read = if next.is_multiple_of(LAG_SAMPLE_EVERY) {
                transcript.last_read_us
            } else {
                0
            };
            let whole = self.whole_links.load(Ordering::SeqCst) > 0;
            let forms = batch.encode_both(next, prev_read, whole)?;
            (frames, legacy) = (forms.packed, forms.whole);
            round = Some(next);
        }
        let mut set = worker_frames::entries(own_writes)?;
        if digest_due {
            set.extend(worker_frames::digest(core.worker_set.lock().digest())?);
        }
        if let Some(legacy) = &mut legacy {
            legacy.extend(set.frames.iter().cloned());
        }
        frames.extend(set.frames);
        Ok(Encoded {
            frames,
            legacy,
            packed,
            set_bytes: set.bytes,
            round,
            digest_sent: digest_due,
        })
    }
}

/// What the transcript says after this round for `entry`, if anything changed
/// since `prev` (or the entry is new to the transcript and has something to
/// say).
fn changes(entry: &WorkerEntry, prev: Option<&Told>) -> Option<Told> {
    let touched = entry.touched.load(Ordering::Relaxed);
    let polled = entry.polled.load(Ordering::Relaxed);
    let snapshot = **entry.own_snapshot.load();
    // A basis only means something next to counts (an untouched slot has
    // no work since the poll).
    let basis_ms = if touched {
        entry.own.basis_ms.load(Ordering::Relaxed)
    } else {
        0
    };
    let slot = touched.then(|| entry.own.read());
    let next = Told {
        serial: entry.serial,
        polled,
        slot,
        basis_ms,
        snapshot,
    };
    let same = match prev {
        Some(p) => {
            p.polled == polled
                && p.slot == slot
                && p.basis_ms == basis_ms
                && p.snapshot.map(|s| s.0) == snapshot.map(|s| s.0)
        }
        // Nothing worth a key definition yet.
        None => !polled && !touched && snapshot.is_none(),
    };
    (!same).then_some(next)
}

/// A link counted among those that need whole-value rounds (see
/// [`Outbox::whole_link`]).
#[derive(Debug)]
pub(crate) struct WholeLink<'a> {
    outbox: &'a Outbox,
    held: bool,
}

impl WholeLink<'_> {
    /// The peer reads packed updates: stop counting this link.
    pub(crate) fn release(&mut self) {
        if std::mem::take(&mut self.held) {
            self.outbox.whole_links.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for WholeLink<'_> {
    fn drop(&mut self) {
        self.release();
    }
}
