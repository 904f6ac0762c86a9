//! Compiles the control-plane contract in `proto/` into Rust (prost + tonic).
//! protoc comes from the `protoc-bin-vendored` crate, so no system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto");
    let files = [
        root.join("monarch_kernel/v1/agent.proto"),
        root.join("monarch_kernel/v1/worker.proto"),
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    tonic_prost_build::configure()
        .bytes(".")
        .compile_protos(&files, &[root])?;
    Ok(())
}
