package entry

import (
	"database/sql"
	"time"
)

// TimePtr is a nullable timestamp as the API gives it: nil when NULL.
func TimePtr(t sql.NullTime) *time.Time {
	if !t.Valid {
		return nil
	}
	return &t.Time
}
