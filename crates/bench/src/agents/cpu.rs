//! CPU time of the machine and of this process, from `/proc`: what the agents bench
//! reports beside its rates (a slow run on a busy or stolen machine shows as such).

/// CPU time, in clock ticks (10 ms): the machine's (`/proc/stat`) and this process's
/// (`/proc/self/stat`, which on a virtual machine also counts the time its vCPUs were
/// stolen). All zero where `/proc` is not there.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Cpu {
    /// user + nice + system + irq + softirq, every CPU.
    busy: u64,
    /// Time the hypervisor ran something else.
    steal: u64,
    /// idle + iowait.
    idle: u64,
    /// This process: user + system.
    own: u64,
}

impl Cpu {
    pub(super) fn now() -> Self {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let all: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| all.get(i).copied().unwrap_or(0);
        let me = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // After the `)` closing the command name: field 3 (state) first; utime and
        // stime are fields 14 and 15.
        let fields: Vec<&str> = me
            .rsplit_once(')')
            .map_or("", |(_, rest)| rest)
            .split_whitespace()
            .collect();
        let field = |i: usize| {
            fields
                .get(i - 3)
                .and_then(|x| x.parse::<u64>().ok())
                .unwrap_or(0)
        };
        Self {
            busy: at(0) + at(1) + at(2) + at(5) + at(6),
            steal: at(7),
            idle: at(3) + at(4),
            own: field(14) + field(15),
        }
    }

    pub(super) fn since(&self, before: &Self) -> Self {
        Self {
            busy: self.busy.saturating_sub(before.busy),
            steal: self.steal.saturating_sub(before.steal),
            idle: self.idle.saturating_sub(before.idle),
            own: self.own.saturating_sub(before.own),
        }
    }

    /// `machine 3.8 s busy, 0.3 s stolen, 1.1 s idle; this process 1.2 s`.
    pub(super) fn describe(&self) -> String {
        let s = |ticks: u64| ticks as f64 / 100.0;
        format!(
            "machine {:.1} s busy, {:.1} s stolen, {:.1} s idle; this process {:.1} s",
            s(self.busy),
            s(self.steal),
            s(self.idle),
            s(self.own)
        )
    }
}
