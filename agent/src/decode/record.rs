//! Decoding ring-buffer records into typed events.

use anyhow::{bail, Result};
use uvmwatch_common::{
    CtxEvent, CuinitEvent, EventHeader, IoctlEvent, KfuncEvent, OpenEvent, TaskEvent, EVENT_CTX,
    EVENT_CUINIT_ENTER, EVENT_CUINIT_EXIT, EVENT_DIED_IN_CALL, EVENT_EXEC, EVENT_FORK, EVENT_IOCTL,
    EVENT_KFUNC, EVENT_OPEN, EVENT_PROC_EXIT,
};

/// One decoded record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
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
    /// A kprobed kernel/driver function failed.
    Kfunc(KfuncEvent),
    /// A CUDA context or device call returned.
    Ctx(CtxEvent),
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
pub fn decode(buf: &[u8]) -> Result<Record> {
    let h: EventHeader = read(buf)?;
    Ok(match h.kind {
        EVENT_IOCTL => Record::Ioctl(read(buf)?),
        EVENT_OPEN => Record::Open(read(buf)?),
        EVENT_CUINIT_ENTER => Record::CuinitEnter(read(buf)?),
        EVENT_CUINIT_EXIT => Record::CuinitExit(read(buf)?),
        EVENT_DIED_IN_CALL => Record::DiedInCall(read(buf)?),
        EVENT_FORK => Record::Fork(read(buf)?),
        EVENT_EXEC => Record::Exec(read(buf)?),
        EVENT_PROC_EXIT => Record::ProcExit(read(buf)?),
        EVENT_KFUNC => Record::Kfunc(read(buf)?),
        EVENT_CTX => Record::Ctx(read(buf)?),
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
        assert_eq!(decode(&bytes(&ev)).unwrap(), Record::Ioctl(ev));

        let mut o = OpenEvent::default();
        o.header.kind = EVENT_OPEN;
        o.path[..15].copy_from_slice(b"/dev/nvidia-uvm");
        o.ret = -2;
        match decode(&bytes(&o)).unwrap() {
            Record::Open(d) => assert_eq!(cstr(&d.path), "/dev/nvidia-uvm"),
            e => panic!("{e:?}"),
        }

        let mut c = CuinitEvent::default();
        c.header.kind = EVENT_CUINIT_EXIT;
        c.ret = 3;
        assert_eq!(decode(&bytes(&c)).unwrap(), Record::CuinitExit(c));

        let mut t = TaskEvent::default();
        t.header.kind = EVENT_DIED_IN_CALL;
        assert_eq!(decode(&bytes(&t)).unwrap(), Record::DiedInCall(t));

        let x = CtxEvent {
            header: EventHeader {
                kind: EVENT_CTX,
                ..EventHeader::default()
            },
            ret: 46,
            call: uvmwatch_common::ctxcall::CTX_CREATE_V2,
            device: 0,
            ..CtxEvent::default()
        };
        assert_eq!(decode(&bytes(&x)).unwrap(), Record::Ctx(x));
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
