//! Build script of the test crate: `SHOAL_REQUIRE_NETNS=1` turns on the
//! `netns_required` cfg, which makes the network-namespace suite a normal
//! test (it then fails when it cannot run). Without it the suite is an
//! ignored test with the reason, so a machine without root never reports
//! it as passed.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(netns_required)");
    println!("cargo::rerun-if-env-changed=SHOAL_REQUIRE_NETNS");
    println!("cargo::rerun-if-changed=build.rs");
    if std::env::var("SHOAL_REQUIRE_NETNS").as_deref() == Ok("1") {
        println!("cargo::rustc-cfg=netns_required");
    }
}
