//! nvmfd entry point.

fn main() {
    eprintln!("nvmfd: under construction");
    std::process::exit(1);
}
