//! Black-box harness for driving the tether binaries the way runtimes do.
