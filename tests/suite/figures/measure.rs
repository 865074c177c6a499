//! What the figures read of a running process from `/proc`: resident memory and CPU time.

use super::*;

/// Resident memory of a process or a mapping, in KiB: `Rss` and `Pss` (shared pages divided
/// among the processes that map them).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Resident {
    pub(super) rss_kib: u64,
    pub(super) pss_kib: u64,
    /// Resident pages accessed since the accessed bits were last cleared (`clear_refs`), or
    /// since they were mapped.
    pub(super) referenced_kib: u64,
}

impl Resident {
    pub(super) fn add(&mut self, other: Resident) {
        self.rss_kib += other.rss_kib;
        self.pss_kib += other.pss_kib;
        self.referenced_kib += other.referenced_kib;
    }
}

/// A process's `Rss`, `Pss` and `Referenced` from `/proc/PID/smaps_rollup`.
pub(super) fn resident(pid: u32) -> Resident {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    let field = |name: &str| {
        text.lines()
            .find_map(|line| kib_field(line, name))
            .unwrap_or_else(|| panic!("no {name} in smaps_rollup: {text}"))
    };
    Resident {
        rss_kib: field("Rss:"),
        pss_kib: field("Pss:"),
        referenced_kib: field("Referenced:"),
    }
}

/// Clears the accessed bits of every page a process maps, so that `Referenced` counts what it
/// touches from now on: its working set over a period.
pub(super) fn clear_referenced(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "1").unwrap();
}

/// One mapping of `/proc/PID/smaps`.
#[derive(Debug)]
pub(super) struct Mapping {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) perms: String,
    /// The file, `[heap]`-like name, or empty for anonymous memory.
    pub(super) path: String,
    pub(super) resident: Resident,
}

pub(super) fn mappings(pid: u32) -> Vec<Mapping> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut mappings: Vec<Mapping> = Vec::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let range = fields
            .next()
            .unwrap_or_default()
            .split_once('-')
            .map(|(start, end)| (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16)));
        if let Some((Ok(start), Ok(end))) = range {
            let perms = fields.next().unwrap_or_default().to_owned();
            let path = fields.skip(3).collect::<Vec<_>>().join(" ");
            mappings.push(Mapping {
                start,
                end,
                perms,
                path,
                resident: Resident::default(),
            });
        } else if let Some(mapping) = mappings.last_mut() {
            if let Some(kib) = kib_field(line, "Rss:") {
                mapping.resident.rss_kib = kib;
            } else if let Some(kib) = kib_field(line, "Pss:") {
                mapping.resident.pss_kib = kib;
            } else if let Some(kib) = kib_field(line, "Referenced:") {
                mapping.resident.referenced_kib = kib;
            }
        }
    }
    mappings
}

pub(super) fn tasks(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// The stack pointer of each thread not running now (`/proc/PID/task/TID/syscall` ends with
/// the stack and program counters).
pub(super) fn stack_pointers(pid: u32) -> Vec<u64> {
    tasks(pid)
        .into_iter()
        .filter_map(|tid| std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok())
        .filter_map(|text| {
            let fields: Vec<&str> = text.split_whitespace().collect();
            let pointer = fields.len().checked_sub(2).filter(|_| fields.len() >= 3)?;
            u64::from_str_radix(fields[pointer].trim_start_matches("0x"), 16).ok()
        })
        .collect()
}

pub(super) const THREAD_STACKS: &str = "thread stacks";

pub(super) const THREAD_ARENAS: &str = "malloc arenas of threads";

/// What a mapping holds, named for the breakdown. Anonymous mappings are told apart by their
/// neighbours: glibc puts an inaccessible guard page below a thread's stack, and reserves the
/// rest of a thread arena's 64 MiB, inaccessible, above the part in use.
pub(super) fn mapping_group(
    mappings: &[Mapping],
    index: usize,
    exe: &str,
    stack_pointers: &[u64],
) -> String {
    let mapping = &mappings[index];
    let below = index
        .checked_sub(1)
        .map(|below| &mappings[below])
        .filter(|below| below.end == mapping.start);
    let above = mappings
        .get(index + 1)
        .filter(|above| above.start == mapping.end);
    let reserved = |other: &Mapping| other.path.is_empty() && other.perms.starts_with("---");
    if mapping.path == exe {
        let section = if mapping.perms.contains('x') {
            "text (r-x)"
        } else if mapping.perms.contains('w') {
            "data (rw-)"
        } else {
            "read-only data (r--)"
        };
        return format!("perch binary, {section}");
    }
    if mapping.path.starts_with('[') {
        return mapping.path.clone();
    }
    if !mapping.path.is_empty() {
        let name = Path::new(&mapping.path).file_name().map_or_else(
            || mapping.path.clone(),
            |name| name.to_string_lossy().into_owned(),
        );
        return format!("file {name}");
    }
    if below.is_some_and(|below| below.path == exe) {
        return "perch binary, .bss".to_owned();
    }
    if stack_pointers
        .iter()
        .any(|pointer| (mapping.start..mapping.end).contains(pointer))
    {
        return THREAD_STACKS.to_owned();
    }
    if above.is_some_and(reserved) {
        return THREAD_ARENAS.to_owned();
    }
    if below.is_some_and(reserved) {
        return THREAD_STACKS.to_owned();
    }
    "anonymous, other (large allocations, runtime maps)".to_owned()
}

/// A process's resident memory by group of mappings, largest first.
pub(super) fn breakdown(pid: u32) -> Vec<(String, Resident)> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let stack_pointers = stack_pointers(pid);
    let mappings = mappings(pid);
    let mut groups: BTreeMap<String, Resident> = BTreeMap::new();
    for index in 0..mappings.len() {
        groups
            .entry(mapping_group(&mappings, index, &exe, &stack_pointers))
            .or_default()
            .add(mappings[index].resident);
    }
    let mut groups: Vec<(String, Resident)> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.rss_kib.cmp(&a.1.rss_kib).then_with(|| a.0.cmp(&b.0)));
    groups
}

/// One thread's scheduler counters.
#[derive(Debug, Clone, Default)]
pub(super) struct ThreadCounts {
    /// The thread's name (`comm`).
    pub(super) name: String,
    pub(super) on_cpu_ns: u64,
    pub(super) voluntary: u64,
    pub(super) involuntary: u64,
}

/// A process's CPU time so far (`utime` + `stime`, dead threads included) and each live
/// thread's counters.
#[derive(Debug)]
pub(super) struct CpuSample {
    pub(super) at: Instant,
    pub(super) cpu_ticks: u64,
    pub(super) threads: BTreeMap<u32, ThreadCounts>,
}

pub(super) fn cpu_sample(pid: u32) -> CpuSample {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name, which is in parentheses; `state` is the first.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks = |field: usize| fields[field - 3].parse::<u64>().unwrap();
    let mut threads = BTreeMap::new();
    for tid in tasks(pid) {
        let (Ok(schedstat), Ok(status), Ok(name)) = (
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")),
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")),
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")),
        ) else {
            continue;
        };
        let counter = |name: &str| {
            status
                .lines()
                .find_map(|line| kib_field(line, name))
                .unwrap_or_default()
        };
        threads.insert(
            tid,
            ThreadCounts {
                name: name.trim().to_owned(),
                on_cpu_ns: schedstat
                    .split_whitespace()
                    .next()
                    .and_then(|value| value.parse().ok())
                    .unwrap_or_default(),
                voluntary: counter("voluntary_ctxt_switches:"),
                involuntary: counter("nonvoluntary_ctxt_switches:"),
            },
        );
    }
    CpuSample {
        at: Instant::now(),
        cpu_ticks: ticks(14) + ticks(15),
        threads,
    }
}

/// Clock ticks per second, the unit of `utime` and `stime`.
pub(super) fn clock_ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|output| String::from_utf8_lossy(&output.stdout).trim().parse().ok())
        .unwrap_or(100)
}

/// What a process did between two samples. Threads alive at both count their difference,
/// threads started between count whole; the switches of threads that ended between are lost
/// (`ended` says how many), their CPU time is not (`utime` and `stime` keep it).
#[derive(Debug)]
pub(super) struct IdleCpu {
    pub(super) elapsed: Duration,
    pub(super) cpu_ms: u64,
    pub(super) on_cpu: ThreadCounts,
    /// Context switches per thread name, most first.
    pub(super) switches_by_thread: Vec<(String, u64)>,
    pub(super) threads_at_start: usize,
    pub(super) threads_at_end: usize,
    pub(super) ended: usize,
}

pub(super) fn idle_cpu(start: &CpuSample, end: &CpuSample) -> IdleCpu {
    let mut total = ThreadCounts::default();
    let mut by_thread: BTreeMap<String, u64> = BTreeMap::new();
    for (tid, now) in &end.threads {
        let before = start.threads.get(tid).cloned().unwrap_or_default();
        let voluntary = now.voluntary.saturating_sub(before.voluntary);
        let involuntary = now.involuntary.saturating_sub(before.involuntary);
        total.on_cpu_ns += now.on_cpu_ns.saturating_sub(before.on_cpu_ns);
        total.voluntary += voluntary;
        total.involuntary += involuntary;
        *by_thread.entry(now.name.clone()).or_default() += voluntary + involuntary;
    }
    let mut switches_by_thread: Vec<(String, u64)> = by_thread.into_iter().collect();
    switches_by_thread.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    IdleCpu {
        elapsed: end.at - start.at,
        cpu_ms: (end.cpu_ticks - start.cpu_ticks) * 1000 / clock_ticks_per_second(),
        on_cpu: total,
        switches_by_thread,
        threads_at_start: start.threads.len(),
        threads_at_end: end.threads.len(),
        ended: start
            .threads
            .keys()
            .filter(|tid| !end.threads.contains_key(tid))
            .count(),
    }
}
