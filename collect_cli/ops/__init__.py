"""Operations on whole datasets, above the format: validate, export, merge."""
