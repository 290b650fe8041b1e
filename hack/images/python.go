package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/zyvor/kairon/internal/debimage"
	"github.com/zyvor/kairon/internal/userimages"
)

const pythonUsage = `Usage: go run ./hack/images python [flags]

Builds kairon/python:3.11 from the Debian packages of
internal/userimages/python.lock into the image cache (once; later runs read
the cache) and prints its name, digest and cached OCI layout. With --push it
also makes sure a registry holds it, as kairon-local does for its own.

Flags:
`

// runPython is the python subcommand: what benchmarks and other
// registries use to get kairon/python.
func runPython(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("images python", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cache := fs.String("cache", "", "image cache directory (default $KAIRON_IMAGES_CACHE, else ~/.cache/kairon/images)")
	push := fs.String("push", "", "registry (host[:port][/path]) to push the image to as <registry>/kairon/python:3.11 unless it already holds this build; loopback and private addresses in plain HTTP, others in HTTPS with podman's or docker's login")
	updateLock := fs.Bool("update-lock", false, "resolve the image's packages again at the archive's current versions, rewrite --lock with today's date, and stop")
	lock := fs.String("lock", "internal/userimages/python.lock", "the lock file --update-lock rewrites")
	fs.Usage = func() {
		fmt.Fprint(stderr, pythonUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("python: unexpected arguments %q", fs.Args())
	}
	if *updateLock {
		pkgs, err := debimage.Resolve(userimages.PythonRoots)
		if err != nil {
			return err
		}
		day := time.Now().UTC().Truncate(24 * time.Hour)
		l := debimage.Lock{Packages: pkgs, Date: day}
		if err := os.WriteFile(*lock, l.Format(fmt.Sprintf(userimages.PythonLockHeader, strings.Join(userimages.PythonRoots, ", "))), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s: %d packages, dated %s\n", *lock, len(pkgs), day.Format(time.DateOnly))
		return nil
	}
	o := userimages.Options{CacheDir: *cache, Progress: stderr}
	img := userimages.Python
	if *push != "" {
		res, err := img.Ensure(ctx, *push, o)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s\t%s\tbuilt=%t\tpushed=%t\n", res.Reference, res.Digest, res.Built, res.Pushed)
		return nil
	}
	built, _, err := img.Build(ctx, o)
	if err != nil {
		return err
	}
	d, err := built.Digest()
	if err != nil {
		return err
	}
	dir, err := img.CachedLayout(o)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s\t%s\t%s\n", img.Name(), d, dir)
	return nil
}
