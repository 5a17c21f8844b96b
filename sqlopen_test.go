package pglease

import "database/sql"

func sqlOpen(driver, url string) (*sql.DB, error) { return sql.Open(driver, url) }
