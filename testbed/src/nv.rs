//! The NVIDIA numbers the fake `libcuda.so.1` uses, for tests that set ioctl rules or check
//! what an agent reported. They match `c/fake_libcuda.c`.
//!
//! Sources, all in NVIDIA's open-gpu-kernel-modules (590.48.01):
//! - RM ioctls are `_IOWR('F', nr, size)`: `NV_IOCTL_MAGIC` and `NV_ESC_CARD_INFO` (0xC8),
//!   `NV_ESC_CHECK_VERSION_STR` (0xD2), `NV_ESC_SYS_PARAMS` (0xD6) in
//!   `kernel-open/common/inc/nv-ioctl-numbers.h`; `NV_ESC_RM_FREE` (0x29), `NV_ESC_RM_CONTROL`
//!   (0x2A), `NV_ESC_RM_ALLOC` (0x2B) in `src/nvidia/arch/nvalloc/unix/include/nv_escape.h`;
//!   parameter structs in `kernel-open/common/inc/nv-ioctl.h`.
//! - UVM commands are plain integers from `kernel-open/nvidia-uvm/uvm_ioctl.h`, except
//!   `UVM_INITIALIZE` from `kernel-open/nvidia-uvm/uvm_linux_ioctl.h`.
//! - `NV_STATUS` codes from `kernel-open/common/inc/nvstatuscodes.h`.

/// Builds `_IOC(_IOC_READ | _IOC_WRITE, 'F', nr, size)`, the encoding of every RM ioctl on
/// `/dev/nvidiactl` and `/dev/nvidiaN`. `size` is in bytes (at most 16383).
pub const fn rm_iowr(nr: u8, size: u16) -> u32 {
    (3 << 30) | ((size as u32 & 0x3fff) << 16) | ((b'F' as u32) << 8) | nr as u32
}

/// RM API version check, `nv_ioctl_rm_api_version_t` (72 bytes): `0xC04846D2`.
pub const NV_ESC_CHECK_VERSION_STR: u32 = rm_iowr(0xD2, 72);
/// RM system parameters, `nv_ioctl_sys_params_t` (8 bytes): `0xC00846D6`.
pub const NV_ESC_SYS_PARAMS: u32 = rm_iowr(0xD6, 8);
/// RM card info: an array of 32 (`NV_MAX_DEVICES`) `nv_ioctl_card_info_t` of 72 bytes:
/// `0xC90046C8`.
pub const NV_ESC_CARD_INFO: u32 = rm_iowr(0xC8, 72 * 32);
/// `NV_ESC_RM_ALLOC`, 48-byte `NVOS64_PARAMETERS`, status at offset 40.
pub const NV_ESC_RM_ALLOC: u32 = 0xC030_462B;
/// `NV_ESC_RM_CONTROL`, 32-byte `NVOS54_PARAMETERS`, status at offset 28.
pub const NV_ESC_RM_CONTROL: u32 = 0xC020_462A;
/// `NV_ESC_RM_FREE`, 16-byte `NVOS00_PARAMETERS`, status at offset 12.
pub const NV_ESC_RM_FREE: u32 = 0xC010_4629;

/// `UVM_INITIALIZE` (16-byte params: flags u64 at 0, rmStatus u32 at 8).
pub const UVM_INITIALIZE: u32 = 0x3000_0001;
/// `UVM_CREATE_RANGE_GROUP` (16 bytes, rmStatus at 8).
pub const UVM_CREATE_RANGE_GROUP: u32 = 0x17;
/// `UVM_REGISTER_GPU` (40 bytes, rmStatus at 36): where GPU bring-up, and an HMM set-up
/// failure or hang, shows.
pub const UVM_REGISTER_GPU: u32 = 0x25;
/// `UVM_PAGEABLE_MEM_ACCESS` (8 bytes, rmStatus at 4).
pub const UVM_PAGEABLE_MEM_ACCESS: u32 = 0x27;
/// `UVM_MM_INITIALIZE` (8 bytes: uvmFd i32 at 0, rmStatus at 4), issued on a second fd.
pub const UVM_MM_INITIALIZE: u32 = 0x4b;

/// `NV_OK`.
pub const NV_OK: u32 = 0;
/// `NV_ERR_NO_MEMORY`, the `rmStatus` of the `register_gpu_no_memory` scenario.
pub const NV_ERR_NO_MEMORY: u32 = 0x51;

/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: i32 = 0;
/// `CUDA_ERROR_NOT_INITIALIZED`: failed UVM set-up, or a forked child.
pub const CUDA_ERROR_NOT_INITIALIZED: i32 = 3;
/// `CUDA_ERROR_NO_DEVICE`: the fake returns it with `UVMWATCH_FAKE_GPUS=0`.
pub const CUDA_ERROR_NO_DEVICE: i32 = 100;
/// `CUDA_ERROR_UNKNOWN`: a device open or an ioctl syscall failed.
pub const CUDA_ERROR_UNKNOWN: i32 = 999;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rm_encodings_match_the_reference() {
        assert_eq!(rm_iowr(0x2B, 48), NV_ESC_RM_ALLOC);
        assert_eq!(rm_iowr(0x2A, 32), NV_ESC_RM_CONTROL);
        assert_eq!(rm_iowr(0x29, 16), NV_ESC_RM_FREE);
        assert_eq!(NV_ESC_CHECK_VERSION_STR, 0xC048_46D2);
        assert_eq!(NV_ESC_SYS_PARAMS, 0xC008_46D6);
        assert_eq!(NV_ESC_CARD_INFO, 0xC900_46C8);
    }
}
