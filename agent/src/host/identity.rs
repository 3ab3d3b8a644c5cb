//! Who a traced process is: its identity from procfs (pid inside its namespace, `comm`,
//! executable, command line, container) and the inference workload it runs, read once at
//! the first event about it and shared by every event after that (an [`Arc`]), until it
//! execs or exits.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use super::{
    procfs,
    workload::{self, WorkloadInfo},
};

/// A process as every output describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Process {
    /// Process id (init pid namespace).
    pub pid: u32,
    /// Process id inside its own pid namespace (last `NSpid` entry), when different.
    pub ns_pid: Option<u32>,
    /// `comm` of the process.
    pub comm: String,
    /// Executable path, when readable.
    pub exe: String,
    /// Command line, when readable.
    pub cmdline: Vec<String>,
    /// Container id (or `lxc:<name>`), when in one.
    pub container_id: Option<String>,
    /// The inference workload (engine, model, pod, ...), as far as procfs tells.
    pub workload: WorkloadInfo,
}

impl Process {
    /// A process known only by its pid and `comm` (procfs unreadable, or in tests).
    pub fn named(pid: u32, comm: &str) -> Process {
        Process {
            pid,
            comm: comm.to_string(),
            ..Process::default()
        }
    }
}

/// Processes kept at most; the cache starts over past this (identities are re-read).
const MAX_PROCESSES: usize = 4096;

/// The identity cache: one [`Process`] per pid, read from `<proc_root>/<pid>` the first
/// time it is asked for.
pub struct Identities {
    proc_root: PathBuf,
    known: HashMap<u32, Arc<Process>>,
    /// Reads of an identity that found only the kernel's pid and comm: the process was gone
    /// from procfs (or its entry unreadable) when the agent needed it.
    gone_total: u64,
}

impl Identities {
    /// A cache reading below `proc_root` (normally `/proc`).
    pub fn new(proc_root: impl Into<PathBuf>) -> Identities {
        Identities {
            proc_root: proc_root.into(),
            known: HashMap::new(),
            gone_total: 0,
        }
    }

    /// The identity of `pid`, read now when not known yet. `comm_hint` names the process
    /// when procfs no longer shows it (it exited).
    pub fn get(&mut self, pid: u32, comm_hint: &str) -> Arc<Process> {
        if let Some(p) = self.known.get(&pid) {
            return p.clone();
        }
        let p = read(&self.proc_root, pid, comm_hint);
        if p == Process::named(pid, comm_hint) {
            // Gone before the agent got to its events: only the kernel's pid and comm are
            // left of it (its executable, command line, container and workload are not).
            self.gone_total += 1;
        }
        let p = Arc::new(p);
        if self.known.len() >= MAX_PROCESSES {
            self.known.clear();
        }
        self.known.insert(pid, p.clone());
        p
    }

    /// Times an identity could not be read, so far: the process had exited (all its
    /// threads) before the agent read `/proc/<pid>` for an event of it (the agent was that
    /// far behind, or the event came after the exit), or its entry could not be read; those
    /// events carry only the pid and `comm` the kernel gave.
    pub fn gone_total(&self) -> u64 {
        self.gone_total
    }

    /// Forgets `pid` (it exec'ed a new image, or exited).
    pub fn forget(&mut self, pid: u32) {
        self.known.remove(&pid);
    }
}

/// Reads the identity of `pid`: what procfs shows, the workload identified from it (with
/// the identity's own readings standing in for files that are gone).
pub fn read(proc_root: &Path, pid: u32, comm_hint: &str) -> Process {
    let leader = procfs::read_thread(proc_root, pid, pid).ok();
    // The main thread may have exited while others run on (a zombie leader has no `exe` nor
    // `cmdline`): then the identity is read through a live thread, named as the process.
    let t = match leader {
        Some(t) if t.exe.is_some() => Some(t),
        leader => procfs::list_threads(proc_root, pid)
            .unwrap_or_default()
            .into_iter()
            .filter(|&tid| tid != pid)
            .find_map(|tid| {
                procfs::read_thread(proc_root, pid, tid)
                    .ok()
                    .filter(|t| t.exe.is_some())
            })
            .map(|mut t| {
                if let Some(l) = &leader {
                    t.comm.clone_from(&l.comm);
                }
                t
            })
            .or(leader),
    };
    let mut p = Process {
        pid,
        ns_pid: procfs::ns_pid(proc_root, pid).ok().flatten(),
        comm: t
            .as_ref()
            .map(|t| t.comm.clone())
            .unwrap_or_else(|| comm_hint.to_string()),
        exe: t
            .as_ref()
            .and_then(|t| t.exe.as_ref())
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        cmdline: t.as_ref().map(|t| t.cmdline.clone()).unwrap_or_default(),
        container_id: t.and_then(|t| t.container_id),
        workload: WorkloadInfo::default(),
    };
    let mut facts = workload::read_facts(proc_root, pid);
    if facts.cmdline.is_empty() {
        facts.cmdline = p.cmdline.clone();
    }
    if facts.exe.is_none() && !p.exe.is_empty() {
        facts.exe = Some(PathBuf::from(&p.exe));
    }
    if facts.comm.is_empty() {
        facts.comm = p.comm.clone();
    }
    p.workload = workload::identify_from(proc_root, pid, facts);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_read_once_and_forgotten_on_request() {
        let me = std::process::id();
        let mut ids = Identities::new("/proc");
        let a = ids.get(me, "x");
        assert_eq!(a.pid, me);
        assert!(!a.exe.is_empty(), "{a:?}");
        assert!(Arc::ptr_eq(&a, &ids.get(me, "x")));
        ids.forget(me);
        assert!(!Arc::ptr_eq(&a, &ids.get(me, "x")));
    }

    #[test]
    fn a_process_that_is_gone_keeps_its_name_and_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let p = read(dir.path(), 4242, "cuda-workload");
        assert_eq!(p, Process::named(4242, "cuda-workload"));
        let mut ids = Identities::new(dir.path());
        ids.get(4242, "cuda-workload");
        ids.get(4242, "cuda-workload");
        assert_eq!(ids.gone_total(), 1, "counted once per read");
        let mut live = Identities::new("/proc");
        live.get(std::process::id(), "x");
        assert_eq!(live.gone_total(), 0);
    }
}
