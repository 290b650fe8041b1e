package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zyvor/kairon/internal/guestagent/wire"
)

// drainGrace is how long output pipes are still waited on once a command
// exited: a child it left running with the pipe open does not hold the
// session past this. What the command itself wrote is in the pipe by then
// and is sent however late the pump gets to it (drainBuffered).
var drainGrace = 250 * time.Millisecond

// afterExitHook, when set (by tests), runs once a command has exited and its
// pipes' deadlines are set.
var afterExitHook func()

// Output streams, as indexes into session.credit.
const (
	outStdout = 0
	outStderr = 1
)

// session is one request's state.
type session struct {
	c  *conn
	id uint32

	mu   sync.Mutex
	cond *sync.Cond
	done bool // ended: waits return
	// credit is how many bytes of stdout and stderr the host still takes.
	credit [2]int
	// stdin holds data received and not yet consumed; the host may send
	// stdinAllowed more bytes.
	stdin        [][]byte
	stdinAllowed int
	stdinClosed  bool
	// cancelled: the host cancelled a session that runs no program (a
	// file write), whose input must then not be taken as complete.
	cancelled bool
	signal    func(string)
	resize    func(rows, cols uint16)
}

func newSession(c *conn, id uint32) *session {
	s := &session{c: c, id: id, credit: [2]int{wire.InitialWindow, wire.InitialWindow}, stdinAllowed: wire.InitialWindow}
	s.cond = sync.NewCond(&s.mu)
	return s
}

func (s *session) stdinData(p []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stdinClosed {
		return fmt.Errorf("stream %d: stdin after its Close", s.id)
	}
	if len(p) > s.stdinAllowed {
		return fmt.Errorf("stream %d: %d bytes of stdin past the window (%d left)", s.id, len(p), s.stdinAllowed)
	}
	s.stdinAllowed -= len(p)
	if len(p) > 0 {
		s.stdin = append(s.stdin, bytes.Clone(p))
		s.cond.Broadcast()
	}
	return nil
}

func (s *session) control(m any) error {
	switch m := m.(type) {
	case *wire.Close:
		if m.Stream != "stdin" {
			return fmt.Errorf("stream %d: the host closed %s", s.id, m.Stream)
		}
		s.mu.Lock()
		s.stdinClosed = true
		s.cond.Broadcast()
		s.mu.Unlock()
	case *wire.Window:
		idx := outStdout
		switch m.Stream {
		case "stderr":
			idx = outStderr
		case "stdin":
			return fmt.Errorf("stream %d: the host granted a stdin window", s.id)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.credit[idx] > 1<<30 {
			return fmt.Errorf("stream %d: %s window past 1 GiB", s.id, m.Stream)
		}
		s.credit[idx] += m.Bytes
		s.cond.Broadcast()
	case *wire.Resize:
		s.mu.Lock()
		f := s.resize
		s.mu.Unlock()
		if f != nil {
			f(m.Rows, m.Cols)
		}
	case *wire.Cancel:
		s.mu.Lock()
		f := s.signal
		if f == nil {
			s.cancelled = true
			s.cond.Broadcast()
		}
		s.mu.Unlock()
		if f != nil {
			f(m.Signal)
		}
	}
	return nil
}

// nextStdin waits for stdin: a chunk, or nil with closed set when the host
// closed it, or nil and false when the session ended.
func (s *session) nextStdin() (p []byte, closed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.stdin) == 0 && !s.stdinClosed && !s.done && !s.cancelled {
		s.cond.Wait()
	}
	if len(s.stdin) > 0 {
		p = s.stdin[0]
		s.stdin[0] = nil
		s.stdin = s.stdin[1:]
		return p, false
	}
	return nil, s.stdinClosed && !s.done
}

// grantStdin lets the host send n more bytes of stdin.
func (s *session) grantStdin(n int) {
	s.mu.Lock()
	s.stdinAllowed += n
	s.mu.Unlock()
	_ = s.c.send(s.id, &wire.Window{Stream: "stdin", Bytes: n})
}

// waitCredit waits until the host takes output on idx: how much may be
// sent (at most one frame), or 0 once the session ended.
func (s *session) waitCredit(idx int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.credit[idx] == 0 && !s.done {
		s.cond.Wait()
	}
	if s.done {
		return 0
	}
	return min(s.credit[idx], wire.MaxPayload)
}

// sendOutput sends p as output on idx (stdout or stderr), spending as much
// of the host's window, which waitCredit granted.
func (s *session) sendOutput(idx int, p []byte) error {
	s.mu.Lock()
	s.credit[idx] -= len(p)
	s.mu.Unlock()
	t := wire.TypeStdout
	if idx == outStderr {
		t = wire.TypeStderr
	}
	return s.c.write(wire.Frame{Type: t, Stream: s.id, Payload: p})
}

func (s *session) end() {
	s.mu.Lock()
	s.done = true
	s.cond.Broadcast()
	s.mu.Unlock()
}

// abort ends the session and kills its program.
func (s *session) abort() {
	s.mu.Lock()
	f := s.signal
	s.mu.Unlock()
	s.end()
	if f != nil {
		f("KILL")
	}
}

func (s *session) run(req *wire.Request) {
	if s.c.send(s.id, &wire.Response{OK: true}) != nil {
		return
	}
	var exit *wire.Exit
	switch req.Op {
	case wire.OpPing:
		exit = &wire.Exit{Status: s.c.a.status()}
	case wire.OpExec:
		exit = s.exec(req.Exec)
	case wire.OpReadFile:
		exit = s.readFile(req.File)
	case wire.OpWriteFile:
		exit = s.writeFile(req.File)
	case wire.OpConfigure:
		exit = &wire.Exit{}
		if err := s.c.a.configure(req.Configure); err != nil {
			exit = &wire.Exit{Code: 1, Error: clip(err.Error())}
		}
	}
	if exit != nil {
		_ = s.c.send(s.id, exit)
	}
}

func failed(err error) *wire.Exit { return &wire.Exit{Code: 1, Error: clip(err.Error())} }

// pump sends what r yields as output on idx, within the host's window,
// until r ends or the session does. Once exited is set, a read that waits
// longer than drainGrace ends it, after sending what the pipe still holds.
func (s *session) pump(idx int, r *os.File, exited *atomic.Bool) {
	buf := make([]byte, wire.MaxPayload)
	for {
		n := s.waitCredit(idx)
		if n == 0 {
			return
		}
		if exited.Load() {
			_ = r.SetReadDeadline(time.Now().Add(drainGrace))
		}
		k, err := r.Read(buf[:n])
		if k > 0 && s.sendOutput(idx, buf[:k]) != nil {
			return
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			s.drainBuffered(idx, r, buf)
		}
		if err != nil {
			return
		}
	}
}

// drainBuffered sends what r's pipe holds now, within the host's window.
// A read whose deadline passed before it ran reads nothing: the guest may
// stall longer than drainGrace between a command's exit and the pump's
// next read (a loaded host, a VM just restored), and what the command
// wrote before it exited must not be lost to that. Only what is buffered
// when it starts is sent, so a child still writing cannot keep it going.
func (s *session) drainBuffered(idx int, r *os.File, buf []byte) {
	rc, err := r.SyscallConn()
	if err != nil {
		return
	}
	var left int // FIONREAD, which Linux names TIOCINQ: bytes waiting in the pipe or PTY
	if cerr := rc.Control(func(fd uintptr) { left, err = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }); cerr != nil || err != nil {
		return
	}
	for left > 0 {
		n := min(s.waitCredit(idx), left)
		if n == 0 {
			return
		}
		var k int
		// Control does not look at the deadline; the descriptor is
		// non-blocking, so this read never waits.
		if cerr := rc.Control(func(fd uintptr) { k, err = unix.Read(int(fd), buf[:n]) }); cerr != nil || err != nil || k <= 0 {
			return
		}
		left -= k
		if s.sendOutput(idx, buf[:k]) != nil {
			return
		}
	}
}

// feed writes stdin to w until the host closes it (then close runs) or the
// session ends. Once w fails, stdin is still taken and dropped, so the host
// never waits on it.
func (s *session) feed(w io.Writer, closeW func()) {
	broken := false
	for {
		p, closed := s.nextStdin()
		if p == nil {
			if closed && closeW != nil {
				closeW()
			}
			return
		}
		if !broken {
			if _, err := w.Write(p); err != nil {
				broken = true
			}
		}
		s.grantStdin(len(p))
	}
}

// command is the program e asks for: in the image of an image guest, else
// in the guest's own root with the agent's base environment, as root
// unless e names a user.
func (a *Agent) command(e *wire.Exec) (*exec.Cmd, error) {
	if img := a.opts.Image; img != nil {
		return img.Command(e.Args, e.Env, e.Dir, e.User, e.TTY)
	}
	cmd := exec.Command(e.Args[0], e.Args[1:]...)
	cmd.Env = append(slices.Clone(a.opts.Env), e.Env...)
	cmd.Dir = e.Dir
	if cmd.Dir == "" {
		cmd.Dir = "/"
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	if e.User != "" {
		acc, err := readAccounts("/")
		if err != nil {
			return nil, err
		}
		id, err := acc.resolveUser(e.User)
		if err != nil {
			return nil, err
		}
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: id.UID, Gid: id.GID, Groups: id.Groups}
	}
	return cmd, nil
}

// startFailure is the Exit of a program that could not start: 127 when it
// is not there, 126 otherwise (as a shell says).
func startFailure(err error) *wire.Exit {
	code := 126
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		code = 127
	}
	return &wire.Exit{Code: code, Error: clip(err.Error())}
}

func (s *session) exec(e *wire.Exec) *wire.Exit {
	cmd, err := s.c.a.command(e)
	if err != nil {
		return startFailure(err)
	}
	var (
		in          io.Writer
		closeIn     func()
		outs        []*os.File // stdout, stderr (one under a TTY)
		childEnds   []*os.File
		closeOnExit []*os.File
	)
	if e.TTY {
		rows, cols := e.Rows, e.Cols
		if rows == 0 || cols == 0 {
			rows, cols = 24, 80
		}
		master, slave, err := openPTY(rows, cols)
		if err != nil {
			return &wire.Exit{Code: 126, Error: clip("pty: " + err.Error())}
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		cmd.SysProcAttr.Setsid, cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, true, 0
		if c := cmd.SysProcAttr.Credential; c != nil {
			// The terminal is the user's, as login makes it.
			_ = slave.Chown(int(c.Uid), int(c.Gid))
		}
		in, outs, childEnds, closeOnExit = master, []*os.File{master}, []*os.File{slave}, []*os.File{master}
		s.mu.Lock()
		s.resize = func(r, c uint16) { _ = setWinsize(master, r, c) }
		s.mu.Unlock()
	} else {
		var pipes [3][2]*os.File
		for i := range pipes {
			r, w, err := os.Pipe()
			if err != nil {
				for _, p := range pipes[:i] {
					p[0].Close()
					p[1].Close()
				}
				return &wire.Exit{Code: 126, Error: clip(err.Error())}
			}
			pipes[i] = [2]*os.File{r, w}
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = pipes[0][0], pipes[1][1], pipes[2][1]
		cmd.SysProcAttr.Setsid = true
		stdinW := pipes[0][1]
		in, closeIn = stdinW, func() { stdinW.Close() }
		outs = []*os.File{pipes[1][0], pipes[2][0]}
		childEnds = []*os.File{pipes[0][0], pipes[1][1], pipes[2][1]}
		closeOnExit = []*os.File{stdinW, pipes[1][0], pipes[2][0]}
	}
	defer func() {
		for _, f := range closeOnExit {
			f.Close()
		}
	}()
	err = cmd.Start()
	for _, f := range childEnds {
		f.Close()
	}
	if err != nil {
		return startFailure(err)
	}
	pgid := cmd.Process.Pid
	var timedOut atomic.Bool
	s.mu.Lock()
	s.signal = func(name string) {
		sig, ok := signals[name]
		if !ok {
			sig = syscall.SIGKILL
		}
		_ = syscall.Kill(-pgid, sig)
	}
	if s.done {
		// Aborted while starting: abort found no program to kill.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	s.mu.Unlock()
	if e.TimeoutSeconds > 0 {
		t := time.AfterFunc(time.Duration(e.TimeoutSeconds)*time.Second, func() {
			timedOut.Store(true)
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		})
		defer t.Stop()
	}
	go s.feed(in, closeIn)
	var exited atomic.Bool
	var wg sync.WaitGroup
	for i, r := range outs {
		wg.Go(func() { s.pump(i, r, &exited) })
	}
	werr := cmd.Wait()
	// The program is gone: a Cancel or a hang-up from now on must not
	// signal its process group, which may hold what it left running on
	// purpose (or, once reused, someone else).
	s.mu.Lock()
	s.signal = nil
	s.mu.Unlock()
	exited.Store(true)
	for _, r := range outs {
		_ = r.SetReadDeadline(time.Now().Add(drainGrace))
	}
	if afterExitHook != nil {
		afterExitHook()
	}
	wg.Wait()

	exit := &wire.Exit{TimedOut: timedOut.Load()}
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	switch {
	case ok && ws.Signaled():
		exit.Code = -1
		exit.Signal = signalNames[ws.Signal()]
		if exit.Signal == "" {
			exit.Error = fmt.Sprintf("killed by signal %d", int(ws.Signal()))
		}
	case ok:
		exit.Code = ws.ExitStatus()
	default:
		exit.Code, exit.Error = 1, clip(fmt.Sprint(werr))
	}
	return exit
}

var signals = map[string]syscall.Signal{
	"TERM": syscall.SIGTERM, "KILL": syscall.SIGKILL, "INT": syscall.SIGINT, "HUP": syscall.SIGHUP,
	"QUIT": syscall.SIGQUIT, "SEGV": syscall.SIGSEGV, "ABRT": syscall.SIGABRT, "PIPE": syscall.SIGPIPE,
	"USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "ALRM": syscall.SIGALRM,
}

var signalNames = func() map[syscall.Signal]string {
	m := map[syscall.Signal]string{}
	for name, sig := range signals {
		m[sig] = name
	}
	return m
}()

// openFile opens path for reading: inside the image of an image guest
// (inroot.go), else in the guest's own root.
func (a *Agent) openFile(path string, flags int) (*os.File, error) {
	if img := a.opts.Image; img != nil {
		return openInRoot(img.Root, path, flags, 0)
	}
	return os.OpenFile(path, flags, 0)
}

func (s *session) readFile(f *wire.File) *wire.Exit {
	// Non-blocking open: a FIFO at the path must not hang the session.
	fh, err := s.c.a.openFile(f.Path, os.O_RDONLY|syscall.O_NONBLOCK)
	if err != nil {
		return failed(err)
	}
	defer fh.Close()
	if st, err := fh.Stat(); err != nil {
		return failed(err)
	} else if !st.Mode().IsRegular() {
		return failed(fmt.Errorf("%s is not a regular file", f.Path))
	}
	buf := make([]byte, wire.MaxPayload)
	for {
		n := s.waitCredit(outStdout)
		if n == 0 {
			return nil
		}
		k, err := fh.Read(buf[:n])
		if k > 0 && s.sendOutput(outStdout, buf[:k]) != nil {
			return nil
		}
		if err == io.EOF {
			return &wire.Exit{}
		}
		if err != nil {
			return failed(err)
		}
	}
}

// writeFile writes stdin to a temporary file beside the path and renames
// it there once the host closed stdin: a reader never sees half a file.
// In an image guest the directory is resolved inside the image, and the
// file belongs to the image's user (root if it names none, or one the
// image does not know), as a file a container's user copied in with tar
// would: the programs the image runs as that user can use it.
func (s *session) writeFile(f *wire.File) *wire.Exit {
	mode := f.Mode
	if mode == 0 {
		mode = 0o644
	}
	root := "/"
	owner := Identity{}
	if img := s.c.a.opts.Image; img != nil {
		root = img.Root
		if id, err := img.Identity(""); err == nil {
			owner = id
		}
	}
	var ended *wire.Exit // the session ended before the file was whole
	err := replaceInRoot(root, f.Path, mode, func(tmp *os.File) error {
		if owner.UID != 0 || owner.GID != 0 {
			if err := tmp.Chown(int(owner.UID), int(owner.GID)); err != nil {
				return err
			}
		}
		for {
			p, closed := s.nextStdin()
			if p == nil {
				s.mu.Lock()
				cancelled := s.cancelled
				s.mu.Unlock()
				if cancelled {
					return errors.New("the host cancelled the write; the file is left as it was")
				}
				if !closed {
					ended = &wire.Exit{}
					return errSessionEnded
				}
				return nil
			}
			if _, err := tmp.Write(p); err != nil {
				return err
			}
			s.grantStdin(len(p))
		}
	})
	if ended != nil {
		return nil
	}
	if err != nil {
		return failed(err)
	}
	return &wire.Exit{}
}

// errSessionEnded stops a write whose session ended.
var errSessionEnded = errors.New("the session ended")
