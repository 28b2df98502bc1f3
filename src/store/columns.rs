//! Reading a row's columns by position, in the order its query selected
//! them. sqlx finds a column named by a string through a hash of the name:
//! for the 22 columns of every claimed job that was 7 % of the engine's
//! instructions per job on SQLite (bench/HISTORY.md, session 28), paid on
//! the path each cycle waits on. Release builds also skip sqlx's check that
//! each column's type suits the Rust type (on Postgres a comparison of type
//! infos per column, about a tenth of the engine's instructions): the
//! schema fixes the types. Debug builds (the tests) check both, each
//! position against the name the reader expects and each type, so a query
//! that selects its columns in another order, or a migration that changes
//! a type, fails there instead of decoding the wrong values.

use sqlx::{Column, ColumnIndex, Decode, Row, Type};

/// A cursor over a row's columns, read one after the other.
pub(crate) struct InOrder<'r, R> {
    row: &'r R,
    next: usize,
}

impl<'r, R: Row> InOrder<'r, R>
where
    usize: ColumnIndex<R>,
{
    pub(crate) fn new(row: &'r R) -> Self {
        InOrder { row, next: 0 }
    }

    /// The next column, which must be `name`.
    pub(crate) fn get<T>(&mut self, name: &str) -> Result<T, sqlx::Error>
    where
        T: Decode<'r, R::Database> + Type<R::Database>,
    {
        self.get_at(self.next, name)
    }

    /// Column `at`, which must be `name`; the next is the one after it.
    pub(crate) fn get_at<T>(&mut self, at: usize, name: &str) -> Result<T, sqlx::Error>
    where
        T: Decode<'r, R::Database> + Type<R::Database>,
    {
        self.next = at + 1;
        debug_assert_eq!(
            self.row.columns().get(at).map(|c| c.name()),
            Some(name),
            "column {at} of the row"
        );
        if cfg!(debug_assertions) {
            self.row.try_get(at)
        } else {
            self.row.try_get_unchecked(at)
        }
    }
}

#[cfg(test)]
mod tests {
    use sqlx::Connection;
    use sqlx::sqlite::{SqliteConnection, SqliteRow};

    use super::*;

    async fn row(sql: &'static str) -> SqliteRow {
        let mut conn = SqliteConnection::connect("sqlite::memory:").await.unwrap();
        sqlx::query(sql).fetch_one(&mut conn).await.unwrap()
    }

    #[tokio::test]
    async fn reads_the_columns_in_their_order() {
        let row = row("SELECT 7 AS id, 'p' AS pipeline").await;
        let mut cols = InOrder::new(&row);
        assert_eq!(cols.get::<i64>("id").unwrap(), 7);
        assert_eq!(cols.get::<String>("pipeline").unwrap(), "p");
        assert_eq!(cols.get_at::<i64>(0, "id").unwrap(), 7);
        assert_eq!(cols.get::<String>("pipeline").unwrap(), "p");
    }

    #[tokio::test]
    #[should_panic(expected = "column 0 of the row")]
    #[cfg(debug_assertions)]
    async fn a_column_out_of_order_fails_in_debug_builds() {
        let row = row("SELECT 'p' AS pipeline, 7 AS id").await;
        let _ = InOrder::new(&row).get::<i64>("id");
    }
}
