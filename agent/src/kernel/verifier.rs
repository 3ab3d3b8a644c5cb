//! What the kernel said refusing a program, short enough for a probe's state: the errno by
//! name and the verifier's verdict, not its whole instruction log.

/// The first line of a load error and the verifier's verdict, not the whole instruction
/// log: the verdict is the last line before the statistics (`processed … insns`,
/// `verification time`, `stack depth`), e.g. `R4 unbounded memory access`.
pub(super) fn short_verifier_error(e: &str) -> String {
    let lines: Vec<&str> = e.lines().collect();
    if lines.len() <= 4 {
        return e.to_string();
    }
    let first = lines[0]
        .split(". Verifier output")
        .next()
        .unwrap_or(lines[0]);
    let is_stat = |l: &str| {
        let l = l.trim();
        l.is_empty()
            || l.starts_with("processed ")
            || l.starts_with("verification time")
            || l.starts_with("stack depth")
            || l.starts_with("max_states_per_insn")
            || l.starts_with(':')
    };
    let verdict = lines
        .iter()
        .rev()
        .find(|l| !is_stat(l))
        .copied()
        .unwrap_or("");
    let stats: Vec<&str> = lines
        .iter()
        .filter(|l| l.trim().starts_with("processed "))
        .copied()
        .collect();
    format!("{first}: {} [{}]", verdict.trim(), stats.join(" "))
}

/// What the kernel said refusing a program: the errno by name and, when the verifier ran,
/// its verdict ([`short_verifier_error`]); an empty verifier log means the program was
/// refused before verification (a permission: lockdown, an LSM, a sysctl).
pub(super) fn refusal(e: &anyhow::Error) -> String {
    if let Some(aya::programs::ProgramError::LoadError {
        io_error,
        verifier_log,
    }) = e.downcast_ref::<aya::programs::ProgramError>()
    {
        let errno = io_error
            .raw_os_error()
            .map(|n| crate::decode::errno::label(n as u32))
            .unwrap_or_else(|| "an error".into());
        let log = verifier_log.to_string();
        let log = log.trim();
        if log.is_empty() {
            return format!(
                "BPF_PROG_LOAD failed with {errno} ({}) before verification, no verifier log",
                io_error.kind()
            );
        }
        return format!(
            "BPF_PROG_LOAD failed with {errno}: {}",
            short_verifier_error(&format!("x\n{log}"))
                .trim_start_matches("x: ")
                .trim_start_matches("x\n")
        );
    }
    short_verifier_error(&format!("{e:#}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn verifier_errors_keep_the_verdict() {
        let log = "the BPF_PROG_LOAD syscall returned Permission denied (os error 13). Verifier output: 0: R1=ctx()\n\
1: (bf) r6 = r1\n\
57: (71) r1 = *(u8 *)(r4 +0)\n\
R4 unbounded memory access, make sure to bounds check any such access\n\
processed 412 insns (limit 1000000) max_states_per_insn 2 total_states 30\n\
verification time 1234 usec\n\
stack depth 184+0\n";
        let s = super::short_verifier_error(log);
        assert!(
            s.starts_with("the BPF_PROG_LOAD syscall returned Permission denied"),
            "{s}"
        );
        assert!(s.contains("R4 unbounded memory access"), "{s}");
        assert!(s.contains("processed 412 insns"), "{s}");
        assert!(!s.contains("(bf) r6"), "{s}");
    }
}
