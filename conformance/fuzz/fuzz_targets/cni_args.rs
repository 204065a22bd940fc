#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::cni_args(data));
