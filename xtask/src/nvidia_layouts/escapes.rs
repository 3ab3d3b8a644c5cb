//! Which params struct each RM escape takes, and which of its fields is the `NV_STATUS` the
//! driver writes back. This is the one hand-written part of the generator: the escapes
//! themselves (names, numbers, added or removed) come from the headers at each tag, and so
//! do the structs' sizes and offsets; this table only says which struct goes with which
//! escape. It was read off the dispatch code of 590.48.01 (`kernel-open/nvidia/nv.c`
//! `nvidia_ioctl`, `src/nvidia/arch/nvalloc/unix/src/escape.c` `RmIoctl`,
//! `src/nvidia/arch/nvalloc/unix/src/osapi.c` `rm_ioctl`), and the generator checks it at
//! every tag: where an escape is dispatched, the dispatching `case` must name the struct.
//!
//! An escape with no entry here, or one that no tag dispatches, is listed in the table by
//! name only.

/// One struct an escape takes.
#[derive(Clone, Copy, Debug)]
pub struct Form {
    /// Typedef names of the struct, newest first (a struct renamed between tags lists
    /// every name it had).
    pub types: &'static [&'static str],
    /// The `NV_STATUS` field as `offsetof` takes it (`status`, `params.status`), or `None`
    /// when the struct has none, or has one that is not the call's `NV_STATUS`.
    pub status: Option<&'static str>,
}

const fn st(types: &'static [&'static str], status: &'static str) -> Form {
    Form {
        types,
        status: Some(status),
    }
}

const fn no(types: &'static [&'static str]) -> Form {
    Form {
        types,
        status: None,
    }
}

/// The forms of each escape, by its macro name.
pub const ESCAPES: &[(&str, &[Form])] = &[
    // escape.c: `nv_ioctl_nvos02_parameters_with_fd *pApi`, the RM writes `params.status`.
    (
        "NV_ESC_RM_ALLOC_MEMORY",
        &[st(&["nv_ioctl_nvos02_parameters_with_fd"], "params.status")],
    ),
    (
        "NV_ESC_RM_ALLOC_OBJECT",
        &[st(&["NVOS05_PARAMETERS"], "status")],
    ),
    ("NV_ESC_RM_FREE", &[st(&["NVOS00_PARAMETERS"], "status")]),
    ("NV_ESC_RM_CONTROL", &[st(&["NVOS54_PARAMETERS"], "status")]),
    // escape.c accepts both sizes: `dataSize == sizeof(NVOS64_PARAMETERS)` selects the
    // form with access rights.
    (
        "NV_ESC_RM_ALLOC",
        &[
            st(&["NVOS21_PARAMETERS"], "status"),
            st(&["NVOS64_PARAMETERS"], "status"),
        ],
    ),
    (
        "NV_ESC_RM_DUP_OBJECT",
        &[st(&["NVOS55_PARAMETERS"], "status")],
    ),
    ("NV_ESC_RM_SHARE", &[st(&["NVOS57_PARAMETERS"], "status")]),
    (
        "NV_ESC_RM_I2C_ACCESS",
        &[st(&["NVOS_I2C_ACCESS_PARAMS"], "status")],
    ),
    (
        "NV_ESC_RM_IDLE_CHANNELS",
        &[st(&["NVOS30_PARAMETERS"], "status")],
    ),
    (
        "NV_ESC_RM_VID_HEAP_CONTROL",
        &[st(&["NVOS32_PARAMETERS"], "status")],
    ),
    (
        "NV_ESC_RM_ACCESS_REGISTRY",
        &[st(&["NVOS38_PARAMETERS"], "status")],
    ),
    (
        "NV_ESC_RM_MAP_MEMORY",
        &[st(&["nv_ioctl_nvos33_parameters_with_fd"], "params.status")],
    ),
    (
        "NV_ESC_RM_UNMAP_MEMORY",
        &[st(&["NVOS34_PARAMETERS"], "status")],
    ),
    // osapi.c (escape.c in older tags).
    (
        "NV_ESC_RM_GET_EVENT_DATA",
        &[st(&["NVOS41_PARAMETERS"], "status")],
    ),
    (
        "NV_ESC_RM_ALLOC_CONTEXT_DMA2",
        &[st(&["NVOS39_PARAMETERS"], "status")],
    ),
    (
        "NV_ESC_RM_MAP_MEMORY_DMA",
        &[st(&["NVOS46_PARAMETERS"], "status")],
    ),
    (
        "NV_ESC_RM_UNMAP_MEMORY_DMA",
        &[st(&["NVOS47_PARAMETERS"], "status")],
    ),
    (
        "NV_ESC_RM_BIND_CONTEXT_DMA",
        &[st(&["NVOS49_PARAMETERS"], "status")],
    ),
    (
        "NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO",
        &[st(&["NVOS56_PARAMETERS"], "status")],
    ),
    // escape.c sets `pParams->status = rmStatus` for the three NVD commands it serves; the
    // same escape (0x5f) was called NV_ESC_RM_NVLOG_CTRL with NV_NVLOG_CTRL_PARAMS before.
    (
        "NV_ESC_RM_NVLOG_CTRL",
        &[st(&["NV_NVLOG_CTRL_PARAMS"], "status")],
    ),
    (
        "NV_ESC_RM_LOCKLESS_DIAGNOSTIC",
        &[st(&["NV_LOCKLESS_DIAGNOSTIC_PARAMS"], "status")],
    ),
    // nv.c: an array of these, as many as fit `_IOC_SIZE`; no status.
    ("NV_ESC_CARD_INFO", &[no(&["nv_ioctl_card_info_t"])]),
    ("NV_ESC_REGISTER_FD", &[no(&["nv_ioctl_register_fd_t"])]),
    // osapi.c: `pApi->Status = allocate_os_event(...)` / `free_os_event(...)`.
    (
        "NV_ESC_ALLOC_OS_EVENT",
        &[st(&["nv_ioctl_alloc_os_event_t"], "Status")],
    ),
    (
        "NV_ESC_FREE_OS_EVENT",
        &[st(&["nv_ioctl_free_os_event_t"], "Status")],
    ),
    // escape.c: `rm_get_adapter_status(pNv, &pApi->status)`: the adapter's NV_STATUS.
    (
        "NV_ESC_STATUS_CODE",
        &[st(&["nv_ioctl_status_code_t"], "status")],
    ),
    // `reply` says whether the version was recognised; no NV_STATUS.
    (
        "NV_ESC_CHECK_VERSION_STR",
        &[no(&["nv_ioctl_rm_api_version_t"])],
    ),
    // A wrapper: the real escape, size and params pointer are inside.
    ("NV_ESC_IOCTL_XFER_CMD", &[no(&["nv_ioctl_xfer_t"])]),
    // nv.c: `query_intr->status = NV_OK`.
    (
        "NV_ESC_QUERY_DEVICE_INTR",
        &[st(
            &["nv_ioctl_query_device_intr_t", "nv_ioctl_query_device_intr"],
            "status",
        )],
    ),
    ("NV_ESC_SYS_PARAMS", &[no(&["nv_ioctl_sys_params_t"])]),
    // `status` of these two is a NUMA state (NV_IOCTL_NUMA_STATUS_*), not an NV_STATUS.
    ("NV_ESC_NUMA_INFO", &[no(&["nv_ioctl_numa_info_t"])]),
    (
        "NV_ESC_SET_NUMA_STATUS",
        &[no(&["nv_ioctl_set_numa_status_t"])],
    ),
    (
        "NV_ESC_EXPORT_TO_DMABUF_FD",
        &[st(&["nv_ioctl_export_to_dma_buf_fd_t"], "status")],
    ),
    // nv.c: `params->rc = nvlfp->open_rc; params->adapterStatus = nvlfp->adapter_status`;
    // `rc` is an errno, `adapterStatus` the NV_STATUS of the open.
    (
        "NV_ESC_WAIT_OPEN_COMPLETE",
        &[st(&["nv_ioctl_wait_open_complete_t"], "adapterStatus")],
    ),
];

/// The forms of the escape `name` (empty when the table has none).
pub fn forms(name: &str) -> &'static [Form] {
    ESCAPES
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(&[], |(_, f)| f)
}
