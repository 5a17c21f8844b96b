package main

import (
	"context"
	"flag"

	"github.com/pglease/pglease/bench/internal/benchenv"
	"github.com/pglease/pglease/internal/pgcluster"
)

type capacityConfig struct{}

func capacityFlags(c *capacityConfig) { _ = flag.CommandLine }

type capacityReport struct{}

func runCapacity(ctx context.Context, cl *pgcluster.Cluster, cpu *benchenv.ServerCPU, c capacityConfig) (*capacityReport, error) {
	return &capacityReport{}, nil
}

func capacitySVG(c *capacityReport) string { return "" }

func (r *report) capacityMarkdown(w func(string, ...any)) {}
