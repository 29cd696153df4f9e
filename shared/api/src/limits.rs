//! How large a package may be. The same limits hold wherever a package is
//! read (render, copy, clone, `pull`), written (a push, a render's result,
//! a variant's mutation) or discovered (a sync reading Kptfiles), so a
//! package that could be written can always be read back, and one pushed to
//! git by other means gets the same clear error instead of exhausting a
//! handler's memory.

/// The most files in one package.
pub const MAX_PACKAGE_FILES: usize = 10_000;

/// The largest single file.
pub const MAX_FILE_BYTES: usize = 8 << 20;

/// The largest package, all files together.
pub const MAX_PACKAGE_BYTES: usize = 64 << 20;

/// Why a package is over a limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error("the package has more than {MAX_PACKAGE_FILES} files")]
    TooManyFiles,
    #[error("{path} has {size} bytes, more than the {MAX_FILE_BYTES} a file may have")]
    FileTooLarge { path: String, size: usize },
    #[error("the package has more than {MAX_PACKAGE_BYTES} bytes in all")]
    PackageTooLarge,
}

/// Adds up a package's files one at a time, failing at the first limit
/// crossed (so nothing larger than the limits is ever held).
#[derive(Debug, Default, Clone, Copy)]
pub struct PackageBudget {
    files: usize,
    bytes: usize,
}

impl PackageBudget {
    /// # Errors
    /// The file is too large, or the package now has too many files or bytes.
    pub fn add(&mut self, path: &str, size: usize) -> Result<(), LimitError> {
        if size > MAX_FILE_BYTES {
            return Err(LimitError::FileTooLarge {
                path: path.to_owned(),
                size,
            });
        }
        self.files += 1;
        if self.files > MAX_PACKAGE_FILES {
            return Err(LimitError::TooManyFiles);
        }
        self.bytes = self.bytes.saturating_add(size);
        if self.bytes > MAX_PACKAGE_BYTES {
            return Err(LimitError::PackageTooLarge);
        }
        Ok(())
    }

    /// Checks a whole file set.
    ///
    /// # Errors
    /// As [`PackageBudget::add`].
    pub fn check<'a>(
        files: impl IntoIterator<Item = (&'a String, &'a Vec<u8>)>,
    ) -> Result<(), LimitError> {
        let mut budget = Self::default();
        for (path, content) in files {
            budget.add(path, content.len())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_limit_crossed_is_reported() {
        let mut budget = PackageBudget::default();
        assert!(budget.add("a", MAX_FILE_BYTES).is_ok());
        assert_eq!(
            budget.add("b", MAX_FILE_BYTES + 1),
            Err(LimitError::FileTooLarge {
                path: "b".into(),
                size: MAX_FILE_BYTES + 1
            })
        );
        for i in 0..7 {
            assert!(budget.add(&format!("f{i}"), MAX_FILE_BYTES).is_ok(), "{i}");
        }
        assert_eq!(budget.add("g", 1), Err(LimitError::PackageTooLarge));
        let mut budget = PackageBudget::default();
        for i in 0..MAX_PACKAGE_FILES {
            budget.add(&format!("f{i}"), 0).expect("within the limit");
        }
        assert_eq!(budget.add("one-more", 0), Err(LimitError::TooManyFiles));
    }
}
