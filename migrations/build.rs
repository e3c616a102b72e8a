//! `sqlx::migrate!` embeds the SQL files at compile time; this makes cargo rebuild the crate
//! when a migration is added or edited (it would not notice new files otherwise).
fn main() {
    for dialect in ["postgres", "mysql", "sqlite"] {
        println!("cargo:rerun-if-changed={dialect}");
    }
}
