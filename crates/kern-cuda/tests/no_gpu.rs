//! Tests of kern-cuda that need no GPU: the no-driver path, launch-configuration checks,
//! parameter packing and error messages. They run in CI (no libcuda there); on a machine
//! with a driver the no-driver test checks the opposite outcome instead.

use kern_cuda::{
    as_bytes, as_bytes_mut, Context, CudaError, LaunchConfig, PackedArgs, ParamSlot,
    NO_DRIVER_MESSAGE,
};
use std::ffi::c_void;

fn libcuda_present() -> bool {
    // SAFETY: only tries to open the driver library (test helper, same check kern-cuda does).
    unsafe { cudarc::driver::sys::is_culib_present() }
}

#[test]
fn context_new_without_driver_is_a_typed_error_not_a_panic() {
    let r = Context::new(0);
    if libcuda_present() {
        // On a GPU machine the same call must not claim the driver is missing.
        assert!(
            !matches!(r, Err(CudaError::NoDriver { .. })),
            "driver present but got NoDriver"
        );
        return;
    }
    match r {
        Err(CudaError::NoDriver { searched }) => {
            assert!(
                searched.iter().any(|s| s.contains("libcuda.so")),
                "search list should name libcuda.so: {searched:?}"
            );
        }
        other => panic!("expected NoDriver, got {other:?}"),
    }
    // Every other driver entry point is gated the same way.
    assert!(matches!(
        Context::device_count(),
        Err(CudaError::NoDriver { .. })
    ));
    assert!(!kern_cuda::driver_available());
    // Repeated calls give the same cached answer.
    assert!(matches!(Context::new(1), Err(CudaError::NoDriver { .. })));
}

#[test]
fn no_driver_message_is_the_user_facing_sentence() {
    let e = CudaError::NoDriver {
        searched: vec!["libcuda.so".into()],
    };
    let s = e.to_string();
    assert_eq!(s, NO_DRIVER_MESSAGE);
    assert!(s.starts_with("no CUDA driver found (libcuda.so could not be loaded)"));
    assert!(s.contains("`kern inspect`, `kern check` and `kern plan` work without one"));
    assert!(!e.is_sticky());
    assert_eq!(e.code(), None);
}

#[test]
fn driver_error_display_names_call_code_and_message() {
    let e = CudaError::Driver {
        call: "cuModuleLoadDataEx",
        code: 209,
        name: "CUDA_ERROR_NO_BINARY_FOR_GPU".into(),
        message: "no kernel image is available for execution on the device".into(),
    };
    assert_eq!(
        e.to_string(),
        "CUDA driver call cuModuleLoadDataEx failed with CUDA_ERROR_NO_BINARY_FOR_GPU (code 209): \
         no kernel image is available for execution on the device"
    );
    assert!(!e.is_sticky());
    assert_eq!(e.code(), Some(209));
}

#[test]
fn sticky_errors_say_the_process_must_restart() {
    let e = CudaError::Driver {
        call: "cuStreamSynchronize",
        code: 700,
        name: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
        message: "an illegal memory access was encountered".into(),
    };
    assert!(e.is_sticky());
    let s = e.to_string();
    assert!(s.starts_with(
        "CUDA driver call cuStreamSynchronize failed with CUDA_ERROR_ILLEGAL_ADDRESS (code 700)"
    ));
    assert!(s.contains("the process must be restarted"), "{s}");
}

#[test]
fn jit_and_other_errors_display() {
    let e = CudaError::Jit {
        code: 218,
        name: "CUDA_ERROR_INVALID_PTX".into(),
        log: "ptxas application ptx input, line 7; error   : Unknown symbol 'foo'".into(),
    };
    let s = e.to_string();
    assert!(s.contains("CUDA_ERROR_INVALID_PTX"), "{s}");
    assert!(s.ends_with("Unknown symbol 'foo'"), "{s}");
    assert_eq!(e.code(), Some(218));

    let e = CudaError::KernelNotFound {
        name: "_Z3fooPf".into(),
    };
    assert!(e.to_string().contains("no kernel named `_Z3fooPf`"));

    let e = CudaError::DriverTooOld {
        call: "cuFuncGetParamInfo",
        driver_version: 12020,
        needed: "update the NVIDIA driver",
    };
    assert_eq!(
        e.to_string(),
        "the installed CUDA driver (CUDA 12.2) does not provide cuFuncGetParamInfo; update the NVIDIA driver"
    );
    let e = CudaError::InvalidArgument("x".into());
    assert_eq!(e.to_string(), "invalid argument: x");
}

#[test]
fn launch_config_rejects_zero_dimensions_before_the_driver() {
    for i in 0..3 {
        let mut grid = [2, 2, 2];
        grid[i] = 0;
        let err = LaunchConfig::new(grid, [32, 1, 1], 0)
            .validate()
            .unwrap_err();
        let axis = ["x", "y", "z"][i];
        assert!(
            err.to_string().contains(&format!("grid.{axis} is 0")),
            "axis {axis}: {err}"
        );
        let mut block = [32, 1, 1];
        block[i] = 0;
        let err = LaunchConfig::new([1, 1, 1], block, 0)
            .validate()
            .unwrap_err();
        assert!(
            err.to_string().contains(&format!("block.{axis} is 0")),
            "{err}"
        );
        assert!(matches!(err, CudaError::InvalidArgument(_)));
    }
}

#[test]
fn launch_config_rejects_oversized_blocks_and_grids() {
    assert!(LaunchConfig::new([1, 1, 1], [1024, 1, 1], 0)
        .validate()
        .is_ok());
    assert!(LaunchConfig::new([1, 1, 1], [32, 32, 1], 0)
        .validate()
        .is_ok());
    let err = LaunchConfig::new([1, 1, 1], [512, 4, 1], 0)
        .validate()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("2048 threads exceeds the limit of 1024"),
        "{err}"
    );
    let err = LaunchConfig::new([1, 1, 1], [1025, 1, 1], 0)
        .validate()
        .unwrap_err();
    assert!(err.to_string().contains("block.x = 1025"), "{err}");
    let err = LaunchConfig::new([1, 1, 1], [1, 1, 65], 0)
        .validate()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("block.z = 65 exceeds the limit of 64"),
        "{err}"
    );
    let err = LaunchConfig::new([1, 65_536, 1], [1, 1, 1], 0)
        .validate()
        .unwrap_err();
    assert!(err.to_string().contains("grid.y = 65536"), "{err}");
    assert!(
        LaunchConfig::new([i32::MAX as u32, 65_535, 65_535], [1, 1, 1], 0)
            .validate()
            .is_ok()
    );
    assert!(LaunchConfig::new([1 << 31, 1, 1], [1, 1, 1], 0)
        .validate()
        .is_err());
}

#[test]
fn launch_config_helpers() {
    let c = LaunchConfig::for_elements(10, 4);
    assert_eq!(c.grid, [3, 1, 1]);
    assert_eq!(c.block, [4, 1, 1]);
    assert!(!c.pdl);
    assert!(c.with_pdl(true).pdl);
    assert_eq!(LaunchConfig::for_elements(0, 128).grid, [1, 1, 1]);
    assert!(LaunchConfig::for_elements(10, 0).validate().is_err());
    assert_eq!(
        LaunchConfig::new([1, 1, 1], [8, 4, 2], 0).threads_per_block(),
        64
    );
}

/// The real layout of `k(char, short, double, struct{i64,i32,f32,i64}, float4-aligned struct,
/// ptr, ptr, u64)` reported by nvcc 13.0 / cuFuncGetParamInfo.
fn mixed_layout() -> Vec<ParamSlot> {
    [
        (0, 1),
        (2, 2),
        (8, 8),
        (16, 24),
        (48, 16),
        (64, 8),
        (72, 8),
        (80, 8),
    ]
    .iter()
    .map(|&(offset, size)| ParamSlot { offset, size })
    .collect()
}

#[test]
fn packed_args_point_at_each_parameter_offset() {
    let layout = mixed_layout();
    let mut args = PackedArgs::new(&layout).unwrap();
    assert_eq!(args.len(), 8);
    assert_eq!(args.bytes().len(), 88);
    args.set(0, &[0x7f]).unwrap();
    args.set_scalar(1, -2i16).unwrap();
    args.set_scalar(2, 1.5f64).unwrap();
    let blob: Vec<u8> = (100..124).collect();
    args.set(3, &blob).unwrap();
    args.set(4, as_bytes(&[1.0f32, 2.0, 3.0, 4.0])).unwrap();
    args.set_scalar(5, 0xdead_beef_0000_1000u64).unwrap();
    args.set_scalar(6, 0x7000_0000_0000_2000u64).unwrap();
    args.set_scalar(7, 42u64).unwrap();

    let base = args.bytes().as_ptr() as usize;
    let bytes_copy = args.bytes().to_vec();
    let ptrs: Vec<*mut c_void> = args.kernel_params().unwrap().to_vec();
    assert_eq!(ptrs.len(), 8);
    for (p, slot) in ptrs.iter().zip(&layout) {
        assert_eq!(*p as usize - base, slot.offset, "slot {slot:?}");
        // SAFETY: the pointer is inside `args`' buffer with `size` bytes after it.
        let got = unsafe { std::slice::from_raw_parts(*p as *const u8, slot.size) };
        assert_eq!(got, &bytes_copy[slot.offset..slot.offset + slot.size]);
    }
    // The 16-byte-aligned struct parameter sits at a 16-byte-aligned address.
    assert_eq!(ptrs[4] as usize % 16, 0);
    // Values landed where the layout says.
    let b = args.bytes();
    assert_eq!(b[0], 0x7f);
    assert_eq!(i16::from_ne_bytes([b[2], b[3]]), -2);
    assert_eq!(&b[8..16], &1.5f64.to_ne_bytes());
    assert_eq!(&b[16..40], blob.as_slice());
    assert_eq!(&b[64..72], &0xdead_beef_0000_1000u64.to_ne_bytes());
    assert_eq!(&b[80..88], &42u64.to_ne_bytes());
    // Padding stays zero.
    assert_eq!(b[1], 0);
    assert!(b[4..8].iter().all(|&x| x == 0));
    assert!(b[40..48].iter().all(|&x| x == 0));
}

#[test]
fn packed_args_reject_wrong_sizes_indices_and_unset_params() {
    let mut args = PackedArgs::new(&mixed_layout()).unwrap();
    let err = args.set_scalar(0, 1u32).unwrap_err();
    assert!(
        err.to_string()
            .contains("parameter 0 is 1 bytes, but a 4-byte value was given"),
        "{err}"
    );
    let err = args.set(8, &[0; 8]).unwrap_err();
    assert!(err.to_string().contains("index 8 is out of range"), "{err}");
    args.set(0, &[1]).unwrap();
    let err = args.kernel_params().unwrap_err();
    assert!(
        err.to_string().contains("parameter 1 was never set"),
        "{err}"
    );
    // Writing the raw bytes counts as setting everything.
    args.bytes_mut()[2] = 9;
    assert_eq!(args.kernel_params().unwrap().len(), 8);
}

#[test]
fn packed_args_reject_bad_layouts() {
    let overlap = [
        ParamSlot { offset: 0, size: 8 },
        ParamSlot { offset: 4, size: 8 },
    ];
    let err = PackedArgs::new(&overlap).unwrap_err();
    assert!(
        err.to_string()
            .contains("parameter 1 (offset 4, size 8) overlaps parameter 0"),
        "{err}"
    );
    let too_big = [ParamSlot {
        offset: 32_760,
        size: 8,
    }];
    assert!(PackedArgs::new(&too_big).is_err());
    let fits = [ParamSlot {
        offset: 32_756,
        size: 8,
    }];
    assert_eq!(PackedArgs::new(&fits).unwrap().bytes().len(), 32_764);
    let overflow = [ParamSlot {
        offset: usize::MAX,
        size: 8,
    }];
    assert!(PackedArgs::new(&overflow).is_err());
    // A kernel without parameters is fine.
    let mut none = PackedArgs::new(&[]).unwrap();
    assert!(none.is_empty());
    assert!(none.kernel_params().unwrap().is_empty());
}

#[test]
fn byte_views_round_trip() {
    let v = [1.0f32, -2.5];
    let b = as_bytes(&v);
    assert_eq!(b.len(), 8);
    assert_eq!(&b[4..8], &(-2.5f32).to_ne_bytes());
    let mut w = [0f32; 2];
    as_bytes_mut(&mut w).copy_from_slice(b);
    assert_eq!(w, v);
}

/// Issue 17: NCCL is loaded at run time like the driver; without libnccl every NCCL entry
/// point is a typed error that says what to install, never a panic.
#[test]
fn nccl_without_the_library_is_a_typed_error_not_a_panic() {
    use kern_cuda::nccl::{nccl, nccl_available, nccl_search_list, Comm, UniqueId};
    // NCCL's soname first: the pip wheels (torch's NCCL) ship no other name, and cudarc's own
    // list lacks it.
    assert_eq!(nccl_search_list()[0], "libnccl.so.2");
    assert!(nccl_search_list().contains(&"libnccl.so".to_string()));
    match nccl() {
        Ok(info) => {
            // A machine with NCCL: the version is one kern accepts.
            assert!(info.version >= 21800, "{info:?}");
            assert!(nccl_available());
            return;
        }
        Err(CudaError::NcclTooOld { .. }) => return,
        Err(CudaError::NoNccl { searched }) => {
            assert_eq!(searched, nccl_search_list());
        }
        Err(other) => panic!("expected NoNccl, got {other:?}"),
    }
    assert!(!nccl_available());
    let text = UniqueId::new().unwrap_err().to_string();
    assert!(text.contains("NCCL not found") && text.contains("nvidia-nccl"), "{text}");
    assert!(matches!(kern_cuda::nccl::group(|| Ok(())), Err(CudaError::NoNccl { .. })));
    // A communicator needs a context first; without a driver that fails typed too.
    if let Ok(ctx) = Context::new(0) {
        assert!(matches!(Comm::init_rank(&ctx, 1, 0, &UniqueId([0; 128])), Err(CudaError::NoNccl { .. })));
    }
}
