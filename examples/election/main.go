// Command election runs a leader loop: one replica leads at a time; on
// SIGINT or SIGTERM the leader stops leading, resigns (another replica takes
// over within milliseconds) and the program exits cleanly.
package main

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"github.com/pglease/pglease"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("shut down cleanly")
}

func run(ctx context.Context) error {
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer db.Close()
	if err := pglease.Migrate(ctx, db); err != nil {
		return err
	}
	locker, err := pglease.New(db, pglease.WithLeaseDuration(15*time.Second))
	if err != nil {
		return err
	}
	defer locker.Close()
	return lead(ctx, locker)
}
