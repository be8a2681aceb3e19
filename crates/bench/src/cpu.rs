//! CPU spent during a measured interval, from `/proc` (Linux): the whole machine's
//! busy time (this process, the database server and anything else running) and this
//! process's own. On two cores CPU per saga bounds the rate, so the saga bench
//! reports both per saga beside each run's rate.

use std::time::Duration;

/// A reading of the machine's and this process's CPU counters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cpu {
    machine: Option<u64>,
    process: Option<u64>,
}

/// CPU used between two readings.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Used {
    /// Busy time of all cores (user, nice, system, irq, softirq).
    pub(crate) machine: Duration,
    /// This process's user and system time.
    pub(crate) process: Duration,
}

/// Clock ticks per second of `/proc`'s counters (`USER_HZ`, 100 on Linux).
const TICKS: u64 = 100;

impl Cpu {
    pub(crate) fn now() -> Self {
        Self {
            machine: machine_ticks(),
            process: process_ticks(),
        }
    }

    /// What was used since `self`, or `None` where `/proc` could not be read.
    pub(crate) fn since(&self) -> Option<Used> {
        let now = Self::now();
        let ticks = |a: Option<u64>, b: Option<u64>| {
            Some(Duration::from_millis(b?.saturating_sub(a?) * 1000 / TICKS))
        };
        Some(Used {
            machine: ticks(self.machine, now.machine)?,
            process: ticks(self.process, now.process)?,
        })
    }
}

/// The first line of `/proc/stat`: user nice system idle iowait irq softirq …
fn machine_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let busy = [0, 1, 2, 5, 6].iter().map(|&i| fields.get(i).copied());
    busy.sum()
}

/// utime + stime of `/proc/self/stat` (fields 14 and 15, after the command's
/// parenthesis, which may hold spaces).
fn process_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_work_shows_in_this_process_and_the_machine() {
        let before = Cpu::now();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        let mut used = Used::default();
        // Spin until this process has used 200 ms of CPU (a bounded loop: 20 s).
        while used.process < Duration::from_millis(200) && start.elapsed() < Duration::from_secs(20)
        {
            for _ in 0..1_000_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
            used = before.since().expect("/proc is readable on Linux");
        }
        std::hint::black_box(x);
        assert!(used.process >= Duration::from_millis(200), "{used:?}");
        // The machine's busy time includes this process's (a tick's rounding aside).
        assert!(
            used.machine + Duration::from_millis(20) >= used.process,
            "{used:?}"
        );
    }
}
