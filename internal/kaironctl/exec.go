package kaironctl

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/zyvor/kairon/internal/execstream"
	"github.com/zyvor/kairon/internal/guestagent/wire"
)

func newExecCommand(o *Options) *cobra.Command {
	var (
		stdin, tty bool
		timeout    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "exec MACHINE [-i] [-t] -- COMMAND [ARG...]",
		Short: "Run a command in a Machine's guest",
		Long: `Run a command in the guest of a Machine, through the guest agent, and exit
with its exit code. MACHINE is a Machine's NAME (or machine/NAME), or a claim
mc/NAME: the Machine bound to it.

-i sends kaironctl's stdin to the command; -t runs it on a pseudo-terminal
(with -i from a terminal: an interactive shell; the terminal is put in raw
mode and window size changes follow). A command killed by a signal exits
128+N; --timeout kills the command after that long (exit 124); Ctrl-C
(without -t) kills it (exit 130).

The node agent refuses with 403 unless you may create machines/exec in the
Machine's namespace (see docs/guides/exec.md).`,
		Example: `  kaironctl exec web-1 -- uname -a
  kaironctl exec mc/my-claim -- sh -c 'exit 3'; echo $?
  kaironctl exec -it web-1 -- sh
  tar c dir | kaironctl exec -i web-1 -- tar x -C /tmp`,
		RunE: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			var target string
			var command []string
			switch {
			case len(args) == 0 || dash == 0:
				return usageError(cmd, "exec needs a MACHINE (NAME or mc/NAME) and, after --, a COMMAND")
			case dash < 0 && len(args) == 1, dash == 1 && len(args) == 1:
				return usageError(cmd, "exec needs a COMMAND after --, e.g. kaironctl exec %s -- uname -a", args[0])
			case dash < 0:
				target, command = args[0], args[1:]
			case dash == 1:
				target, command = args[0], args[1:]
			default:
				return usageError(cmd, "exec takes one MACHINE before --, got %q", strings.Join(args[:dash], " "))
			}
			if timeout < 0 || timeout > wire.MaxTimeoutSeconds*time.Second {
				return usageError(cmd, "--timeout must be between 0 (none) and 24h, got %s", timeout)
			}
			ctx := cmd.Context()
			ref, err := o.resolveMachine(ctx, "MACHINE", target)
			if err != nil {
				return err
			}
			params := url.Values{"command": command}
			if stdin {
				params.Set("stdin", "true")
			}
			if timeout > 0 {
				params.Set("timeout", strconv.Itoa(int(timeout.Round(time.Second)/time.Second)))
			}
			inFd, inTerminal := terminalFd(o.In)
			if tty && !inTerminal && stdin {
				fmt.Fprintln(o.ErrOut, "Unable to use a TTY: stdin is not a terminal; running without one")
				tty = false
			}
			var raw *rawTerminal
			if tty {
				params.Set("tty", "true")
				rows, cols := 24, 80
				if inTerminal {
					if w, h, err := termSize(inFd); err == nil {
						cols, rows = w, h
					}
				}
				params.Set("rows", strconv.Itoa(rows))
				params.Set("cols", strconv.Itoa(cols))
			}
			conn, err := o.openStream(ctx, ref, "exec", params, "create on machines/exec")
			if err != nil {
				return err
			}
			s := execstream.Session{Stdout: o.Out, Stderr: o.ErrOut}
			if stdin {
				s.Stdin = o.In
			}
			if tty && inTerminal && stdin {
				if raw, err = makeRaw(inFd); err != nil {
					conn.Close()
					return err
				}
				defer raw.restore()
				s.Resize = raw.resizes(ctx)
			}
			exit, err := execstream.Run(ctx, conn, s)
			if raw != nil {
				raw.restore()
			}
			if ctx.Err() != nil {
				// Interrupted (Ctrl-C without -t): the command was killed,
				// whether its Exit arrived before the stream was closed.
				return &ExitCodeError{Code: 130}
			}
			if err != nil {
				return fmt.Errorf("exec in %s: %w", ref, err)
			}
			return exitResult(exit, fmt.Sprintf("exec in %s", ref))
		},
	}
	cmd.Flags().BoolVarP(&stdin, "stdin", "i", false, "Send stdin to the command")
	cmd.Flags().BoolVarP(&tty, "tty", "t", false, "Run the command on a pseudo-terminal")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "Kill the command after this long (0: never)")
	return cmd
}

// exitResult turns how a guest command ended into kaironctl's exit.
func exitResult(exit *wire.Exit, what string) error {
	switch {
	case exit.TimedOut:
		return &ExitCodeError{Code: 124, Message: what + ": the command timed out"}
	case exit.Error != "":
		code := exit.Code
		if code <= 0 {
			code = 1
		}
		return &ExitCodeError{Code: code, Message: what + ": " + exit.Error}
	case exit.Signal != "":
		return &ExitCodeError{Code: 128 + signalNumber(exit.Signal)}
	case exit.Code != 0:
		return &ExitCodeError{Code: exit.Code}
	}
	return nil
}

func signalNumber(name string) int {
	switch name {
	case "HUP":
		return 1
	case "INT":
		return 2
	case "QUIT":
		return 3
	case "TERM":
		return 15
	case "PIPE":
		return 13
	case "SEGV":
		return 11
	case "ABRT":
		return 6
	}
	return 9
}

func newCpCommand(o *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file into or out of a Machine's guest",
		Long: `Copy one file between this computer and a Machine's guest, through the guest
agent. Exactly one of SRC and DST is MACHINE:PATH, where MACHINE is a
Machine's NAME (or machine/NAME) or a claim mc/NAME, and PATH is absolute in
the guest. A local "-" is stdin or stdout.

Into the guest, the file keeps its permission bits and appears whole or not
at all (the guest writes a temporary file and renames it). Out of the guest,
a local directory as DST takes the file's name; the local file is also
written whole or not at all.

Needs create on machines/exec, as kubectl cp needs pods/exec.`,
		Example: `  kaironctl cp ./script.py web-1:/tmp/script.py
  kaironctl cp mc/my-claim:/var/log/app.log .
  kaironctl cp web-1:/etc/os-release -`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 {
				return usageError(cmd, "cp takes a SRC and a DST, one of them MACHINE:PATH; got %d arguments", len(args))
			}
			srcMachine, srcPath, srcRemote := remoteSpec(args[0])
			dstMachine, dstPath, dstRemote := remoteSpec(args[1])
			switch {
			case srcRemote && dstRemote:
				return usageError(cmd, "cp copies between this computer and one Machine; SRC %q and DST %q both name a Machine", args[0], args[1])
			case !srcRemote && !dstRemote:
				return usageError(cmd, "cp needs MACHINE:/ABSOLUTE/PATH as SRC or DST; neither %q nor %q is one", args[0], args[1])
			case srcRemote:
				return o.copyOut(cmd.Context(), srcMachine, srcPath, args[1])
			default:
				return o.copyIn(cmd.Context(), args[0], dstMachine, dstPath)
			}
		},
	}
	return cmd
}

// remoteSpec splits MACHINE:PATH, where PATH is absolute and MACHINE is
// NAME or KIND/NAME.
func remoteSpec(arg string) (machine, path string, ok bool) {
	machine, path, found := strings.Cut(arg, ":")
	if !found || machine == "" || !strings.HasPrefix(path, "/") || strings.Count(machine, "/") > 1 || strings.HasPrefix(machine, ".") {
		return "", "", false
	}
	return machine, path, true
}

func (o *Options) copyIn(ctx context.Context, local, target, path string) error {
	var (
		in   io.Reader
		mode os.FileMode = 0o644
	)
	if local == "-" {
		in = o.In
	} else {
		f, err := os.Open(local)
		if err != nil {
			return fmt.Errorf("SRC: %w", err)
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return fmt.Errorf("SRC: %w", err)
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("SRC %s is not a regular file (cp copies one file)", local)
		}
		in, mode = f, st.Mode().Perm()
	}
	ref, err := o.resolveMachine(ctx, "DST", target)
	if err != nil {
		return err
	}
	params := url.Values{"path": {path}, "mode": {fmt.Sprintf("%04o", mode)}}
	conn, err := o.openStream(ctx, ref, "files/write", params, "create on machines/exec")
	if err != nil {
		return err
	}
	exit, err := execstream.Run(ctx, conn, execstream.Session{Stdin: in})
	if err != nil {
		return fmt.Errorf("copy to %s:%s: %w", ref, path, err)
	}
	return plainExit(exit, fmt.Sprintf("copy to %s:%s", ref, path))
}

func (o *Options) copyOut(ctx context.Context, target, path, local string) error {
	ref, err := o.resolveMachine(ctx, "SRC", target)
	if err != nil {
		return err
	}
	var (
		out      io.Writer = o.Out
		tmp      *os.File
		finalDst string
	)
	if local != "-" {
		finalDst = local
		if st, err := os.Stat(local); err == nil && st.IsDir() {
			finalDst = filepath.Join(local, filepath.Base(path))
		}
		tmp, err = os.CreateTemp(filepath.Dir(finalDst), "."+filepath.Base(finalDst)+".kaironctl-*")
		if err != nil {
			return fmt.Errorf("DST: %w", err)
		}
		defer os.Remove(tmp.Name()) // gone once renamed
		defer tmp.Close()
		out = tmp
	}
	conn, err := o.openStream(ctx, ref, "files/read", url.Values{"path": {path}}, "create on machines/exec")
	if err != nil {
		return err
	}
	exit, err := execstream.Run(ctx, conn, execstream.Session{Stdout: out})
	if err != nil {
		return fmt.Errorf("copy from %s:%s: %w", ref, path, err)
	}
	if err := plainExit(exit, fmt.Sprintf("copy from %s:%s", ref, path)); err != nil {
		return err
	}
	if tmp == nil {
		return nil
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("DST: %w", err)
	}
	if err := os.Rename(tmp.Name(), finalDst); err != nil {
		return fmt.Errorf("DST: %w", err)
	}
	return nil
}

// plainExit is a copy's or a console's end: an error, or nil.
func plainExit(exit *wire.Exit, what string) error {
	if exit.Error != "" {
		return fmt.Errorf("%s: %s", what, exit.Error)
	}
	if exit.Code != 0 || exit.Signal != "" {
		return fmt.Errorf("%s: ended with code %d %s", what, exit.Code, exit.Signal)
	}
	return nil
}

// escapeKey leaves a console: Ctrl-], as telnet and virsh console.
const escapeKey = 0x1d

func newConsoleCommand(o *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "console MACHINE",
		Short: "Attach to a Machine's serial console",
		Long: `Attach this terminal to the serial console of a Machine's guest: what the
guest prints appears here and what you type goes to it, in raw mode. Press
Ctrl-] to leave. MACHINE is a Machine's NAME (or machine/NAME) or a claim
mc/NAME.

One session at a time may attach to a console. Typing into a console needs
create on machines/console; reading it (kaironctl logs) needs get.`,
		Example: `  kaironctl console web-1
  kaironctl console mc/my-claim`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError(cmd, "console takes one MACHINE (NAME or mc/NAME), got %d arguments", len(args))
			}
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			ref, err := o.resolveMachine(ctx, "MACHINE", args[0])
			if err != nil {
				return err
			}
			conn, err := o.openStream(ctx, ref, "console/attach", nil, "create on machines/console")
			if err != nil {
				return err
			}
			fd, isTerminal := terminalFd(o.In)
			var raw *rawTerminal
			if isTerminal {
				if raw, err = makeRaw(fd); err != nil {
					conn.Close()
					return err
				}
				defer raw.restore()
			}
			fmt.Fprintf(o.ErrOut, "Attached to the console of %s; press Ctrl-] to leave.\r\n", ref)
			left := false
			in := &escapeReader{r: o.In, escape: func() { left = true; cancel() }}
			exit, err := execstream.Run(ctx, conn, execstream.Session{Stdin: in, Stdout: o.Out})
			if raw != nil {
				raw.restore()
			}
			if left || (err != nil && cmd.Context().Err() != nil) {
				fmt.Fprintln(o.ErrOut, "\nLeft the console.")
				return nil
			}
			if err != nil {
				return fmt.Errorf("console of %s: %w", ref, err)
			}
			return plainExit(exit, fmt.Sprintf("console of %s", ref))
		},
	}
	return cmd
}

// escapeReader passes its reader on up to the escape key, then calls
// escape and reports the end.
type escapeReader struct {
	r      io.Reader
	escape func()
	done   bool
}

func (e *escapeReader) Read(p []byte) (int, error) {
	if e.done {
		return 0, io.EOF
	}
	n, err := e.r.Read(p)
	if i := bytes.IndexByte(p[:n], escapeKey); i >= 0 {
		e.done = true
		e.escape()
		return i, nil
	}
	if err == io.EOF {
		// stdin ended (not a terminal): the console stays attached,
		// printing, until interrupted.
		e.done = true
	}
	return n, err
}

// terminalFd is r's file descriptor if r is a terminal.
func terminalFd(r io.Reader) (int, bool) {
	f, ok := r.(*os.File)
	if !ok {
		return 0, false
	}
	fd := int(f.Fd())
	return fd, term.IsTerminal(fd)
}

func termSize(fd int) (cols, rows int, err error) { return term.GetSize(fd) }

// rawTerminal is a terminal in raw mode until restored.
type rawTerminal struct {
	fd    int
	state *term.State
}

func makeRaw(fd int) (*rawTerminal, error) {
	state, err := term.MakeRaw(fd)
	if err != nil {
		return nil, fmt.Errorf("raw terminal: %w", err)
	}
	return &rawTerminal{fd: fd, state: state}, nil
}

func (t *rawTerminal) restore() {
	if t.state != nil {
		_ = term.Restore(t.fd, t.state)
		t.state = nil
	}
}

// resizes sends the terminal's size now and after each SIGWINCH.
func (t *rawTerminal) resizes(ctx context.Context) <-chan wire.Resize {
	out := make(chan wire.Resize, 1)
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	go func() {
		defer signal.Stop(winch)
		for {
			if w, h, err := term.GetSize(t.fd); err == nil && w > 0 && h > 0 && w < 1<<16 && h < 1<<16 {
				select {
				case <-out:
				default:
				}
				out <- wire.Resize{Rows: uint16(h), Cols: uint16(w)}
			}
			select {
			case <-ctx.Done():
				return
			case <-winch:
			}
		}
	}()
	return out
}
