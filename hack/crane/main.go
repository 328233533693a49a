// crane, go-containerregistry's registry tool, built from its module: the docs' way to push
// the OCI archives `make images` writes to a registry, and the tests' loopback registry
// (`crane registry serve`) that checks the archives load the way the docs say.
package main

import (
	"context"
	"os"
	"os/signal"

	"github.com/google/go-containerregistry/cmd/crane/cmd"
	"github.com/google/go-containerregistry/pkg/logs"
)

func main() {
	logs.Warn.SetOutput(os.Stderr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := cmd.Root.ExecuteContext(ctx); err != nil {
		stop()
		os.Exit(1)
	}
}
