//! Generates the Rust code of `proto/dtx/v1/dtx.proto` (messages, services, and their proto3
//! JSON serde) with a vendored `protoc`, so a machine with only the Rust toolchain builds the
//! workspace.
#[allow(unsafe_code)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; prost-build reads PROTOC from the environment.
    unsafe { std::env::set_var("PROTOC", protoc) };
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        // Maps encode in key order, so equal definitions encode to equal bytes (used to detect
        // "same key, different content" on idempotent repeats).
        .btree_map(".")
        // Undecodable requests are INVALID_ARGUMENT, not tonic's INTERNAL (see `codec.rs`).
        .codec_path("crate::codec::WireCodec")
        .file_descriptor_set_path(out_dir.join("dtx_descriptor.bin"))
        .compile_protos(&["proto/dtx/v1/dtx.proto"], &["proto"])?;
    // serde in the proto3 JSON mapping (camelCase names, enum names, base64 bytes) for the
    // HTTP/JSON front end and HTTP participants: generated from the same descriptors, so the
    // JSON and the gRPC messages cannot drift apart.
    let descriptors = std::fs::read(out_dir.join("dtx_descriptor.bin"))?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptors)?
        .btree_map(["."])
        .out_dir(&out_dir)
        .build(&[".dtx.v1"])?;
    println!("cargo:rerun-if-changed=proto/dtx/v1/dtx.proto");
    Ok(())
}
