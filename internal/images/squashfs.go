package images

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
)

// Sqfstar is squashfs-tools' tar-to-squashfs converter (Debian 12's 4.5.1):
// it builds the filesystem image from a tar stream on its stdin, so no
// image's tree is ever extracted onto the node.
const Sqfstar = "sqfstar"

// Compressor is the squashfs compression the store uses:
// docs/design/image-format.md compares the others and says why lz4.
const Compressor = "lz4"

// sqfstarArgs builds a reproducible image (fixed times, the root owned by
// root and 0755) whose compression is Compressor. -exit-on-error makes
// what sqfstar would otherwise skip with a warning a failure.
func sqfstarArgs(out string) []string {
	return []string{"-quiet", "-no-progress", "-exit-on-error",
		"-comp", Compressor,
		"-root-mode", "0755", "-root-uid", "0", "-root-gid", "0",
		"-root-time", "0", "-mkfs-time", "0",
		out}
}

// writeSquashfs runs sqfstar to create out (which must not exist) from the
// tar stream produce writes. On any error out may be left half-written:
// the caller removes it.
func writeSquashfs(ctx context.Context, out string, produce func(io.Writer) error) error {
	cmd := exec.CommandContext(ctx, Sqfstar, sqfstarArgs(out)...)
	var msgs tailBuffer
	cmd.Stdout, cmd.Stderr = &msgs, &msgs
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("running %s (Debian package squashfs-tools): %w", Sqfstar, err)
	}
	perr := produce(stdin)
	if perr != nil {
		// A truncated stream is still a valid tar to sqfstar: it must not
		// get to finish one.
		_ = cmd.Process.Kill()
	}
	cerr := stdin.Close()
	werr := cmd.Wait()
	var outErr errOutput
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case perr != nil && !errors.As(perr, &outErr):
		return perr // the image's fault, or the caller's
	case werr != nil:
		return fmt.Errorf("%s: %w: %s", Sqfstar, werr, strings.TrimSpace(msgs.String()))
	case perr != nil:
		return perr
	case cerr != nil && !errors.Is(cerr, io.ErrClosedPipe):
		return cerr
	}
	return nil
}

// tailBuffer keeps the last 8 KiB written to it: sqfstar's complaint,
// without letting it fill memory.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - 8<<10; over > 0 {
		t.buf = bytes.Clone(t.buf[over:])
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
