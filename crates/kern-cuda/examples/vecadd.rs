//! VecAdd end to end through kern-cuda: load an image, find `_Z6VecAddPfS_S_`, read its
//! parameter layout, allocate three buffers, launch (eagerly, with PDL, and as a replayed
//! CUDA graph), copy back and check `[11, 22, 33, 44]`.
//!
//! ```text
//! cargo run -p kern-cuda --example vecadd                      # embedded PTX (JIT-compiled)
//! cargo run -p kern-cuda --example vecadd -- vecadd.sm90.cubin # a cubin/fatbin/PTX file
//! ```
//! The file must contain the Programming Guide kernel
//! `__global__ void VecAdd(float* A, float* B, float* C) { int i = threadIdx.x; C[i] = A[i] + B[i]; }`.
//! Without a GPU it prints the no-driver message and exits with status 2.

use kern_cuda::{as_bytes, as_bytes_mut, Context, CudaError, Event, LaunchConfig, PackedArgs};

/// Hand-written PTX equivalent of nvcc's output for VecAdd (no NUL terminator: kern-cuda
/// adds it). `.target sm_52` so any current GPU can JIT it.
const VECADD_PTX: &str = r#"
.version 7.0
.target sm_52
.address_size 64

.visible .entry _Z6VecAddPfS_S_(
    .param .u64 _Z6VecAddPfS_S__param_0,
    .param .u64 _Z6VecAddPfS_S__param_1,
    .param .u64 _Z6VecAddPfS_S__param_2
)
{
    .reg .b32   %r<2>;
    .reg .f32   %f<4>;
    .reg .b64   %rd<11>;

    ld.param.u64        %rd1, [_Z6VecAddPfS_S__param_0];
    ld.param.u64        %rd2, [_Z6VecAddPfS_S__param_1];
    ld.param.u64        %rd3, [_Z6VecAddPfS_S__param_2];
    cvta.to.global.u64  %rd4, %rd1;
    cvta.to.global.u64  %rd5, %rd2;
    cvta.to.global.u64  %rd6, %rd3;
    mov.u32             %r1, %tid.x;
    mul.wide.u32        %rd7, %r1, 4;
    add.s64             %rd8, %rd4, %rd7;
    add.s64             %rd9, %rd5, %rd7;
    add.s64             %rd10, %rd6, %rd7;
    ld.global.f32       %f1, [%rd8];
    ld.global.f32       %f2, [%rd9];
    add.f32             %f3, %f1, %f2;
    st.global.f32       [%rd10], %f3;
    ret;
}
"#;

const N: usize = 4;
const REPLAYS: usize = 1000;

fn main() {
    match run() {
        Ok(()) => println!("vecadd: OK"),
        Err(e @ CudaError::NoDriver { .. }) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
        Err(e) => {
            eprintln!("vecadd: FAILED: {e}");
            std::process::exit(1);
        }
    }
}

fn run() -> Result<(), CudaError> {
    let image = match std::env::args().nth(1) {
        Some(path) => std::fs::read(&path)
            .map_err(|e| CudaError::InvalidArgument(format!("cannot read {path}: {e}")))?,
        None => VECADD_PTX.as_bytes().to_vec(),
    };

    let ctx = Context::new(0)?;
    let p = ctx.props();
    println!(
        "device 0: {} ({}), {} SMs, {:.1} GiB, driver {}",
        p.name,
        p.sm_name(),
        p.sm_count,
        p.total_mem as f64 / (1u64 << 30) as f64,
        p.driver_version
    );

    let module = ctx.load_module(&image)?;
    let f = module.function("_Z6VecAddPfS_S_")?;
    let layout = f.param_layout()?;
    println!("param layout: {layout:?}");
    let attrs = f.attributes()?;
    println!("attributes: {attrs:?}");

    let a = [1.0f32, 2.0, 3.0, 4.0];
    let b = [10.0f32, 20.0, 30.0, 40.0];
    let bytes = std::mem::size_of_val(&a);
    let da = ctx.alloc(bytes)?;
    let db = ctx.alloc(bytes)?;
    let dc = ctx.alloc_zeroed(bytes)?;
    da.copy_from_host(0, as_bytes(&a))?;
    db.copy_from_host(0, as_bytes(&b))?;

    let mut args = PackedArgs::for_function(&f)?;
    args.set_scalar(0, da.ptr())?;
    args.set_scalar(1, db.ptr())?;
    args.set_scalar(2, dc.ptr())?;
    let stream = ctx.stream()?;
    let cfg = LaunchConfig::new([1, 1, 1], [N as u32, 1, 1], 0);

    // 1. Eager launch.
    // SAFETY: da/db/dc hold N floats each and outlive the launch; N threads touch index < N.
    unsafe { f.launch_packed(cfg, &stream, &mut args)? };
    stream.synchronize()?;
    expect(&dc, "eager")?;

    // 2. Programmatic Dependent Launch (cuLaunchKernelEx).
    dc.memset_u8(0, bytes, 0)?;
    // SAFETY: as above.
    unsafe { f.launch_packed(cfg.with_pdl(true), &stream, &mut args)? };
    stream.synchronize()?;
    expect(&dc, "pdl")?;

    // 3. Graph: capture one launch, replay it many times, time it.
    dc.memset_u8(0, bytes, 0)?;
    let graph = stream.capture(|s| {
        // SAFETY: as above; the buffers outlive the graph and its replays.
        unsafe { f.launch_packed(cfg, s, &mut args) }
    })?;
    println!("graph nodes: {}", graph.node_count()?);
    let exec = graph.instantiate()?;
    exec.upload(&stream)?;
    let (start, end) = (Event::new(&ctx, true)?, Event::new(&ctx, true)?);
    start.record(&stream)?;
    for _ in 0..REPLAYS {
        // SAFETY: the module and the three buffers are alive for the whole loop.
        unsafe { exec.launch(&stream)? };
    }
    end.record(&stream)?;
    end.synchronize()?;
    ctx.check_device_errors()?;
    expect(&dc, "graph")?;
    let ms = Event::elapsed_ms(&start, &end)?;
    println!(
        "graph replay: {REPLAYS} launches in {ms:.3} ms ({:.2} µs each)",
        ms as f64 * 1e3 / REPLAYS as f64
    );

    // 4. A PTX compile error comes back with the JIT log.
    match ctx.load_module(
        b".version 7.0\n.target sm_52\n.address_size 64\n.visible .entry broken() { bogus; }",
    ) {
        Err(CudaError::Jit { log, .. }) => {
            println!("broken PTX rejected with a log: {}", first_line(&log))
        }
        Err(e) => println!("broken PTX rejected: {e}"),
        Ok(_) => return Err(CudaError::InvalidArgument("broken PTX was accepted".into())),
    }
    let (free, total) = ctx.mem_info()?;
    println!("memory: {free} free of {total} bytes");
    Ok(())
}

fn expect(dc: &kern_cuda::DeviceBuffer, what: &str) -> Result<(), CudaError> {
    let mut c = [0f32; N];
    dc.copy_to_host(0, as_bytes_mut(&mut c))?;
    println!("{what:>6}: C = {c:?}");
    if c != [11.0, 22.0, 33.0, 44.0] {
        return Err(CudaError::InvalidArgument(format!(
            "{what}: wrong result {c:?}"
        )));
    }
    Ok(())
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}
