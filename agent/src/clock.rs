//! The agent's clock: `CLOCK_MONOTONIC` nanoseconds, the clock of the kernel's
//! `bpf_ktime_get_ns()`, in which every event is timed, and its mapping to wall-clock time.

/// `clock_gettime(CLOCK_MONOTONIC)` in ns: the clock of `bpf_ktime_get_ns()`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Maps `CLOCK_MONOTONIC` to wall-clock time with an offset measured once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clock {
    /// `CLOCK_REALTIME - CLOCK_MONOTONIC` in ns when measured.
    pub offset_ns: i128,
    /// `CLOCK_MONOTONIC` ns at the measurement.
    pub mono_ns: u64,
    /// `CLOCK_REALTIME` ns (Unix epoch) at the measurement.
    pub unix_ns: u64,
}

impl Clock {
    /// Measures the offset now (the two clocks read back to back).
    pub fn measure() -> Clock {
        let mono = crate::clock::monotonic_ns();
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Clock {
            offset_ns: unix as i128 - mono as i128,
            mono_ns: mono,
            unix_ns: unix,
        }
    }

    /// Wall-clock ns since the Unix epoch of a monotonic time.
    pub fn to_unix_nanos(&self, mono_ns: u64) -> u64 {
        (mono_ns as i128 + self.offset_ns).max(0) as u64
    }
}
