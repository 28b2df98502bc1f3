fn main() {
    let args: Vec<String> = std::env::args().collect();
    // The step supervisor is this same binary in a hidden mode; it must start
    // before any runtime or logging is set up.
    if args.get(1).map(String::as_str) == Some("__supervise") {
        std::process::exit(jobdeck::engine::supervisor::main(args[2..].to_vec()));
    }
    println!("jobdeck");
}
