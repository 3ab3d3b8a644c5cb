//! Decoding ring-buffer records into typed events.

use anyhow::{bail, Result};
use uvmwatch_common::{
    ContextCallEvent, CuinitEvent, EventHeader, IoctlEvent, KernelFnEvent, OpenEvent, TaskEvent,
    EVENT_CONTEXT_CALL, EVENT_CUINIT_ENTER, EVENT_CUINIT_EXIT, EVENT_DIED_IN_CALL, EVENT_EXEC,
    EVENT_FORK, EVENT_IOCTL, EVENT_KERNEL_FN, EVENT_OPEN, EVENT_PROC_EXIT,
};

/// One decoded record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelRecord {
    /// A finished ioctl worth reporting.
    Ioctl(IoctlEvent),
    /// A device node or libcuda open.
    Open(OpenEvent),
    /// `cuInit` entered.
    CuinitEnter(CuinitEvent),
    /// `cuInit` returned.
    CuinitExit(CuinitEvent),
    /// A thread exited with a call in flight.
    DiedInCall(TaskEvent),
    /// A tracked process forked.
    Fork(TaskEvent),
    /// A tracked process exec'ed.
    Exec(TaskEvent),
    /// A tracked process exited.
    ProcExit(TaskEvent),
    /// A probed kernel/driver function failed.
    KernelFn(KernelFnEvent),
    /// A CUDA context or device call returned.
    ContextCall(ContextCallEvent),
}

fn read<T: Copy>(buf: &[u8]) -> Result<T> {
    if buf.len() < std::mem::size_of::<T>() {
        bail!(
            "record of {} bytes is shorter than {} bytes",
            buf.len(),
            std::mem::size_of::<T>()
        );
    }
    // SAFETY: length checked; T is a repr(C) plain-old-data record from uvmwatch-common;
    // read_unaligned copes with the ring buffer's 8-byte alignment.
    Ok(unsafe { std::ptr::read_unaligned(buf.as_ptr() as *const T) })
}

/// Decodes one ring-buffer record.
///
/// # Errors
/// A record shorter than its kind's struct or of an unknown kind (an agent/eBPF mismatch).
pub fn decode(buf: &[u8]) -> Result<KernelRecord> {
    let h: EventHeader = read(buf)?;
    Ok(match h.kind {
        EVENT_IOCTL => KernelRecord::Ioctl(read(buf)?),
        EVENT_OPEN => KernelRecord::Open(read(buf)?),
        EVENT_CUINIT_ENTER => KernelRecord::CuinitEnter(read(buf)?),
        EVENT_CUINIT_EXIT => KernelRecord::CuinitExit(read(buf)?),
        EVENT_DIED_IN_CALL => KernelRecord::DiedInCall(read(buf)?),
        EVENT_FORK => KernelRecord::Fork(read(buf)?),
        EVENT_EXEC => KernelRecord::Exec(read(buf)?),
        EVENT_PROC_EXIT => KernelRecord::ProcExit(read(buf)?),
        EVENT_KERNEL_FN => KernelRecord::KernelFn(read(buf)?),
        EVENT_CONTEXT_CALL => KernelRecord::ContextCall(read(buf)?),
        k => bail!("unknown event kind {k}"),
    })
}

/// A NUL-padded byte array as a string (lossy).
pub fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T>(v: &T) -> Vec<u8> {
        // SAFETY: reading the bytes of a repr(C) value.
        unsafe {
            std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>())
                .to_vec()
        }
    }

    #[test]
    fn round_trips_each_kind() {
        let mut ev = IoctlEvent::default();
        ev.header.kind = EVENT_IOCTL;
        ev.header.tgid = 42;
        ev.cmd = 0x25;
        ev.status = 0x51;
        assert_eq!(decode(&bytes(&ev)).unwrap(), KernelRecord::Ioctl(ev));

        let mut o = OpenEvent::default();
        o.header.kind = EVENT_OPEN;
        o.path[..15].copy_from_slice(b"/dev/nvidia-uvm");
        o.ret = -2;
        match decode(&bytes(&o)).unwrap() {
            KernelRecord::Open(d) => assert_eq!(cstr(&d.path), "/dev/nvidia-uvm"),
            e => panic!("{e:?}"),
        }

        let mut c = CuinitEvent::default();
        c.header.kind = EVENT_CUINIT_EXIT;
        c.ret = 3;
        assert_eq!(decode(&bytes(&c)).unwrap(), KernelRecord::CuinitExit(c));

        let mut t = TaskEvent::default();
        t.header.kind = EVENT_DIED_IN_CALL;
        assert_eq!(decode(&bytes(&t)).unwrap(), KernelRecord::DiedInCall(t));

        let x = ContextCallEvent {
            header: EventHeader {
                kind: EVENT_CONTEXT_CALL,
                ..EventHeader::default()
            },
            ret: 46,
            call: uvmwatch_common::context_call::CTX_CREATE_V2,
            device: 0,
            ..ContextCallEvent::default()
        };
        assert_eq!(decode(&bytes(&x)).unwrap(), KernelRecord::ContextCall(x));
        assert!(decode(&bytes(&x)[..60]).is_err());
    }

    #[test]
    fn rejects_short_and_unknown() {
        let mut ev = IoctlEvent::default();
        ev.header.kind = EVENT_IOCTL;
        let b = bytes(&ev);
        assert!(decode(&b[..50]).is_err());
        assert!(decode(&b[..10]).is_err());
        ev.header.kind = 999;
        assert!(decode(&bytes(&ev))
            .unwrap_err()
            .to_string()
            .contains("unknown"));
    }
}
