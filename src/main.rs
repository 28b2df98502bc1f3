fn main() {
    println!("jobdeck");
}
