//! Kernel and driver functions probed with kprobe/kretprobe pairs, and core-kernel ones with
//! fentry/fexit on the fentry backend.
//!
//! The list is written once, in [`kernel_fns!`](crate::kernel_fns): the ids below, the eBPF programs
//! (`agent-ebpf/src/probes/kernel_fn.rs`), the agent's probe registry
//! (`agent/src/kernel/registry.rs`) and the probe table of `docs/probes.md` (generated from the
//! registry) are all expanded from it.
//!
//! An id is the index in the `KF_HIST` array and the `func` of [`KernelFnKey`](crate::KernelFnKey),
//! [`KernelFnResultKey`](crate::KernelFnResultKey) and [`KernelFnEvent`](crate::KernelFnEvent);
//! never reuse one. Names and return types: NVIDIA open-gpu-kernel-modules
//! `kernel-open/nvidia-uvm/` (535..595; each row's "lives in" names the versions) and the kernel's
//! `mm/memremap.c`, `mm/hmm.c`, `mm/migrate_device.c`, `kernel/resource.c`.

/// Hands every probed function to `$callback!` as one row per function:
///
/// ```text
/// (ID = n, "symbol", module, RET, SCOPE, enter_program, exit_program, "lives in", "purpose"),
/// ```
///
/// * `ID = n`: the constant in [`kernel_fn`](crate::kernel_fn) and its number (rows are in id order,
///   from 0 without gaps; the build checks it);
/// * `"symbol"`: the function's name in `/proc/kallsyms`;
/// * `module`: `Some("nvidia_uvm")` for a function of that module, `None` for the core kernel;
/// * `RET`: how it reports failure, one of [`ret`] (`NV_STATUS`, `ERR_PTR`, `ERRNO`, `VOID`);
/// * `SCOPE`: which calls count, one of [`scope`] (`ANY`, `UVM_IOCTL`);
/// * `enter_program`, `exit_program`: the kprobe and kretprobe program names (the kernel keeps
///   15 bytes of a name; the registry's test checks they stay distinct);
/// * `fentry_program`, `fexit_program`: the same on a BPF trampoline, used for core-kernel
///   functions (`module` `None`) on the fentry backend; every row has them (a macro cannot
///   leave them out of the module rows), the module rows' are never loaded;
/// * `"lives in"`: the kernel source file, or the module and the driver versions that have it;
/// * `"purpose"`: what the pair gives, as `uvmwatch probes` and `docs/probes.md` say it.
///
/// A callback matches the rows with
///
/// ```text
/// ($(($id:ident = $n:literal, $sym:literal, $module:expr, $ret:ident, $scope:ident,
///     $enter:ident, $exit:ident, $fentry:ident, $fexit:ident, $lives:literal, $purpose:literal)),* $(,)?)
/// ```
#[macro_export]
macro_rules! kernel_fns {
    ($callback:ident) => {
        $callback! {
            (REQUEST_FREE_MEM_REGION = 0, "request_free_mem_region", None, ERR_PTR, UVM_IOCTL,
                kp_free_mem_region, krp_free_mem_region, fe_free_mem_region, fx_free_mem_region, "kernel/resource.c",
                "HMM device-memory set-up: its error (-34 ERANGE in the KASLR case) inside a UVM ioctl"),
            (MEMREMAP_PAGES = 1, "memremap_pages", None, ERR_PTR, UVM_IOCTL,
                kp_memremap_pages, krp_memremap_pages, fe_memremap_pages, fx_memremap_pages, "mm/memremap.c",
                "HMM device-memory set-up: its error inside a UVM ioctl"),
            (UVM_API_REGISTER_GPU = 2, "uvm_api_register_gpu", Some("nvidia_uvm"), NV_STATUS, ANY,
                kp_api_register_gpu, krp_api_register_gpu, fe_api_register_gpu, fx_api_register_gpu, "nvidia_uvm",
                "UVM_REGISTER_GPU: latency and NV_STATUS"),
            (UVM_VA_SPACE_REGISTER_GPU = 3, "uvm_va_space_register_gpu", Some("nvidia_uvm"),
                NV_STATUS, ANY, kp_va_space_reg_gpu, krp_va_space_reg_gpu, fe_va_space_reg_gpu, fx_va_space_reg_gpu, "nvidia_uvm",
                "GPU registration in the VA space: latency and NV_STATUS"),
            (UVM_GPU_RETAIN_BY_UUID = 4, "uvm_gpu_retain_by_uuid", Some("nvidia_uvm"), NV_STATUS,
                ANY, kp_gpu_retain, krp_gpu_retain, fe_gpu_retain, fx_gpu_retain, "nvidia_uvm",
                "global UVM lock wait plus GPU bring-up: latency and NV_STATUS"),
            (UVM_HMM_VA_BLOCK_SERVICE_LOCKED = 5, "uvm_hmm_va_block_service_locked",
                Some("nvidia_uvm"), NV_STATUS, ANY, kp_hmm_block_svc, krp_hmm_block_svc, fe_hmm_block_svc, fx_hmm_block_svc,
                "nvidia_uvm", "HMM fault servicing: count and latency"),
            (HMM_RANGE_FAULT = 6, "hmm_range_fault", None, ERRNO, ANY,
                kp_hmm_range_fault, krp_hmm_range_fault, fe_hmm_range_fault, fx_hmm_range_fault, "mm/hmm.c",
                "HMM faults (every caller): count, latency, errors"),
            (MIGRATE_VMA_SETUP = 7, "migrate_vma_setup", None, ERRNO, ANY,
                kp_migrate_setup, krp_migrate_setup, fe_migrate_setup, fx_migrate_setup, "mm/migrate_device.c",
                "HMM migration set-up: count, latency, errors"),
            (MIGRATE_VMA_PAGES = 8, "migrate_vma_pages", None, VOID, ANY,
                kp_migrate_pages, krp_migrate_pages, fe_migrate_pages, fx_migrate_pages, "mm/migrate_device.c",
                "HMM migration: count and latency"),
            (MIGRATE_VMA_FINALIZE = 9, "migrate_vma_finalize", None, VOID, ANY,
                kp_migrate_final, krp_migrate_final, fe_migrate_final, fx_migrate_final, "mm/migrate_device.c",
                "HMM migration finalize: count and latency"),
            (UVM_HMM_MIGRATE_RANGES = 10, "uvm_hmm_migrate_ranges", Some("nvidia_uvm"), NV_STATUS,
                ANY, kp_hmm_migrate, krp_hmm_migrate, fe_hmm_migrate, fx_hmm_migrate, "nvidia_uvm",
                "UVM HMM migrations: count, latency, NV_STATUS"),
            (PARENT_GPU_SERVICE_REPLAYABLE = 11, "uvm_parent_gpu_service_replayable_faults",
                Some("nvidia_uvm"), VOID, ANY, kp_pgpu_replay, krp_pgpu_replay, fe_pgpu_replay, fx_pgpu_replay,
                "nvidia_uvm (560+)", "replayable GPU fault batches (560+)"),
            (PARENT_GPU_SERVICE_NON_REPLAYABLE = 12,
                "uvm_parent_gpu_service_non_replayable_fault_buffer", Some("nvidia_uvm"), VOID, ANY,
                kp_pgpu_nonreplay, krp_pgpu_nonreplay, fe_pgpu_nonreplay, fx_pgpu_nonreplay, "nvidia_uvm (560+)",
                "non-replayable GPU fault batches (560+)"),
            (GPU_SERVICE_REPLAYABLE = 13, "uvm_gpu_service_replayable_faults", Some("nvidia_uvm"),
                VOID, ANY, kp_gpu_replay, krp_gpu_replay, fe_gpu_replay, fx_gpu_replay, "nvidia_uvm (535/550)",
                "replayable GPU fault batches (535/550)"),
            (GPU_SERVICE_NON_REPLAYABLE = 14, "uvm_gpu_service_non_replayable_fault_buffer",
                Some("nvidia_uvm"), VOID, ANY, kp_gpu_nonreplay, krp_gpu_nonreplay, fe_gpu_nonreplay, fx_gpu_nonreplay,
                "nvidia_uvm (535/550)", "non-replayable GPU fault batches (535/550)"),
        }
    };
}

/// The ids and [`COUNT`], from the rows of [`kernel_fns!`](crate::kernel_fns).
macro_rules! define_ids {
    ($(($id:ident = $n:literal, $sym:literal, $module:expr, $ret:ident, $scope:ident,
        $enter:ident, $exit:ident, $fentry:ident, $fexit:ident, $lives:literal, $purpose:literal)),* $(,)?) => {
        $(
            #[doc = concat!("`", $sym, "()` (", $lives, ", returns [`ret::", stringify!($ret),
                "`], counts [`scope::", stringify!($scope), "`]): ", $purpose, ".")]
            pub const $id: u32 = $n;
        )*
        /// Number of functions (size of `KF_HIST`).
        pub const COUNT: u32 = [$($n),*].len() as u32;
        // Ids are array indexes (`KF_HIST`, the registry's tables): 0, 1, 2, ... in row order.
        const _: () = {
            let ids: [u32; COUNT as usize] = [$($n),*];
            let mut i = 0;
            while i < ids.len() {
                assert!(ids[i] == i as u32, "kernel_fns! rows must be numbered 0, 1, 2, ... in order");
                i += 1;
            }
        };
    };
}

crate::kernel_fns!(define_ids);

/// How a function reports failure: how the kretprobe turns its return value into a
/// [`result`](crate::result) kind and code.
pub mod ret {
    /// Returns `NV_STATUS` (u32; 0 = `NV_OK`).
    pub const NV_STATUS: u8 = 0;
    /// Returns a pointer or `ERR_PTR(-errno)` (an error in `[-4095, -1]`).
    pub const ERR_PTR: u8 = 1;
    /// Returns 0 or `-errno` (int).
    pub const ERRNO: u8 = 2;
    /// Returns nothing: every call counts as "returned".
    pub const VOID: u8 = 3;
}

/// Which calls of a function are counted.
pub mod scope {
    /// Every call, whoever makes it.
    pub const ANY: u8 = 0;
    /// Only calls made inside an ioctl on a UVM node: the HMM set-up allocators are called by
    /// other drivers too, and only the register-GPU path's calls are UVM's.
    pub const UVM_IOCTL: u8 = 1;
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    macro_rules! rows {
        ($(($id:ident = $n:literal, $sym:literal, $module:expr, $ret:ident, $scope:ident,
            $enter:ident, $exit:ident, $fentry:ident, $fexit:ident, $lives:literal, $purpose:literal)),* $(,)?) => {
            [$((super::$id, $sym, $module, super::ret::$ret, super::scope::$scope)),*]
        };
    }

    #[test]
    fn rows_are_numbered_and_distinct() {
        let rows: [(u32, &str, Option<&str>, u8, u8); super::COUNT as usize] =
            crate::kernel_fns!(rows);
        let mut names: Vec<&str> = rows.iter().map(|r| r.1).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), rows.len(), "a function is listed twice");
        for (i, (id, _, module, ret, scope)) in rows.iter().enumerate() {
            assert_eq!(*id as usize, i);
            assert!(matches!(module, None | Some("nvidia_uvm")));
            assert!(*ret <= super::ret::VOID);
            assert!(*scope <= super::scope::UVM_IOCTL);
        }
        assert_eq!(super::REQUEST_FREE_MEM_REGION, 0);
        assert_eq!(super::GPU_SERVICE_NON_REPLAYABLE, 14);
        assert_eq!(super::COUNT, 15);
    }
}
