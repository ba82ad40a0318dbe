//! Page-locked staging for a step's host↔device copies (issue 15): the inputs of a step are
//! packed into one pinned buffer and copied with one stream-ordered DMA per buffer, and
//! results come back through a second one; nothing else blocks the host.
//!
//! * [`pack`] (pure): where each write goes in the staging buffer.
//! * [`Staging`]: a pinned buffer owned by a runtime, allocated on first use and grown
//!   geometrically, with an event recorded after the last copies that use it. Refilling it
//!   first waits for that event, so bytes still being copied are never overwritten (cheap: in
//!   a step loop the previous step's readback has already synchronized the stream). Dropping it
//!   waits too, so the pinned memory is never freed under a copy.

use crate::{Result, RuntimeError};
use kern_cuda::{Context, Event, PinnedBuffer, Stream};

/// Alignment of each write inside the staging buffer.
pub const STAGING_ALIGN: usize = 16;

/// The smallest staging buffer allocated (pinned allocations are slow: grow rarely).
pub const MIN_STAGING_BYTES: usize = 64 << 10;

/// Offsets of writes of `sizes` bytes packed one after another at [`STAGING_ALIGN`]-aligned
/// offsets, and the bytes they span. `None` when the total overflows `usize`.
pub fn pack(sizes: &[usize]) -> Option<(Vec<usize>, usize)> {
    let mut offsets = Vec::with_capacity(sizes.len());
    let mut end = 0usize;
    for &n in sizes {
        let at = end.checked_next_multiple_of(STAGING_ALIGN)?;
        offsets.push(at);
        end = at.checked_add(n)?;
    }
    Some((offsets, end))
}

/// The size of the staging buffer to allocate for `need` bytes: the next power of two, at
/// least [`MIN_STAGING_BYTES`] (exactly `need` when the power of two overflows).
pub fn capacity_for(need: usize) -> usize {
    need.checked_next_power_of_two().unwrap_or(need).max(MIN_STAGING_BYTES)
}

/// A pinned staging buffer and the event that says when queued copies stop using it.
#[derive(Default)]
pub(crate) struct Staging {
    buf: Option<PinnedBuffer>,
    /// Recorded on the stream after the last copies queued from / into `buf`.
    done: Option<Event>,
    /// Copies using `buf` may still be in flight (`done` was recorded after them).
    in_flight: bool,
}

impl Staging {
    /// Waits until no queued copy uses the buffer, then returns it with at least `len` bytes
    /// (reallocated, larger, when it is too small). Also makes sure [`Staging::queued`] has an
    /// event to record, so that nothing can fail between queuing copies and recording it.
    pub(crate) fn acquire(&mut self, ctx: &Context, len: usize) -> Result<&mut PinnedBuffer> {
        self.wait()?;
        if self.done.is_none() {
            self.done = Some(Event::new(ctx, false)?);
        }
        if self.buf.as_ref().is_none_or(|b| b.len() < len) {
            // The old buffer is idle (waited above): free it before pinning the new one.
            self.buf = None;
            let cap = capacity_for(len);
            self.buf = Some(ctx.alloc_pinned(cap).map_err(RuntimeError::cuda(format!("pinning {} of host memory for staging step copies", crate::plan::human(cap as u64))))?);
        }
        Ok(self.buf.as_mut().expect("allocated above"))
    }

    /// Call after queuing copies that use the buffer on `stream` (with their outcome):
    /// records the event the next [`Staging::acquire`] waits for. When queuing or recording
    /// failed, waits for the stream instead, so no copy is left in flight untracked.
    pub(crate) fn queued(&mut self, stream: &Stream, copies: Result<()>) -> Result<()> {
        let recorded = match &self.done {
            Some(e) => e.record(stream).map_err(RuntimeError::from),
            None => Err(RuntimeError::Mismatch("staging: copies queued without acquire".into())),
        };
        match (copies, recorded) {
            (Ok(()), Ok(())) => {
                self.in_flight = true;
                Ok(())
            }
            (Err(e), _) | (Ok(()), Err(e)) => {
                // Best effort: the copies queued so far finish (or the context is dead, and
                // nothing runs any more).
                let _ = stream.synchronize();
                self.in_flight = false;
                Err(e)
            }
        }
    }

    /// Blocks until the copies queued before the last [`Staging::queued`] have completed.
    pub(crate) fn wait(&mut self) -> Result<()> {
        if self.in_flight {
            if let Some(e) = &self.done {
                e.synchronize()?;
            }
            self.in_flight = false;
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // The pinned memory must outlive the copies that use it. Errors cannot be reported
        // from Drop (a failed wait means a dead context: nothing runs any more).
        let _ = self.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_pack_at_aligned_offsets() {
        assert_eq!(pack(&[]), Some((vec![], 0)));
        assert_eq!(pack(&[4]), Some((vec![0], 4)));
        assert_eq!(pack(&[4, 4, 16, 1, 0, 3]), Some((vec![0, 16, 32, 48, 64, 64], 67)));
        assert_eq!(pack(&[0, 0]), Some((vec![0, 0], 0)), "empty writes take no room");
        assert_eq!(pack(&[17, 32]), Some((vec![0, 32], 64)));
        let (offs, total) = pack(&[5, 100, 7, 64]).unwrap();
        for (w, (&o, &n)) in offs.iter().zip(&[5usize, 100, 7, 64]).enumerate() {
            assert_eq!(o % STAGING_ALIGN, 0, "write {w} is aligned");
            if let Some(&next) = offs.get(w + 1) {
                assert!(o + n <= next, "write {w} ends before the next begins");
            } else {
                assert_eq!(o + n, total, "the last write ends the packed bytes");
            }
        }
    }

    #[test]
    fn packing_overflow_is_none_not_a_panic() {
        assert_eq!(pack(&[usize::MAX]), Some((vec![0], usize::MAX)));
        assert_eq!(pack(&[usize::MAX, 1]), None);
        assert_eq!(pack(&[usize::MAX - 3, 0]), None, "aligning the next offset overflows");
    }

    #[test]
    fn staging_grows_to_powers_of_two_with_a_floor() {
        assert_eq!(capacity_for(0), MIN_STAGING_BYTES);
        assert_eq!(capacity_for(100), MIN_STAGING_BYTES);
        assert_eq!(capacity_for(MIN_STAGING_BYTES + 1), 2 * MIN_STAGING_BYTES);
        assert_eq!(capacity_for(3 << 20), 4 << 20);
        assert_eq!(capacity_for(usize::MAX), usize::MAX);
    }
}
