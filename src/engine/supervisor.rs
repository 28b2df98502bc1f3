//! Placeholder: replaced by the supervisor implementation.
pub fn main(_args: Vec<String>) -> i32 {
    2
}
