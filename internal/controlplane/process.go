package controlplane

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// spawner starts every child from one locked OS thread. Pdeathsig fires when
// the *thread* that forked the child exits, not the process, and the Go
// runtime may retire threads; a thread that lives exactly as long as the
// control plane makes "children never outlive us" hold.
type spawner struct{ reqs chan func() }

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan func())}
	go func() {
		runtime.LockOSThread()
		// Returning while still locked makes the runtime end this thread,
		// which is what sends Pdeathsig to anything still running.
		for f := range s.reqs {
			f()
		}
	}()
	return s
}

func (s *spawner) start(cmd *exec.Cmd) error {
	done := make(chan error)
	s.reqs <- func() { done <- cmd.Start() }
	return <-done
}

func (s *spawner) close() { close(s.reqs) }

// child is one control-plane process with its log file.
type child struct {
	name     string
	cmd      *exec.Cmd
	logPath  string
	logStart int64 // where this run's output begins in the (appended) log
	logFile  *os.File

	exited   chan struct{} // closed once the process has been reaped
	exitErr  error         // valid after exited is closed
	stopping atomic.Bool   // set before we signal it, so its exit is expected
}

// startChild runs bin with args, its output appended to logs/<name>.log.
// onUnexpectedExit is called (from another goroutine) if the process exits
// before stop was called.
func startChild(sp *spawner, logsDir, name, bin string, args []string, onUnexpectedExit func(*child)) (*child, error) {
	logPath := filepath.Join(logsDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "\n==== kairon: %s %s\n==== %s %s\n", time.Now().Format(time.RFC3339), name, bin, strings.Join(args, " "))
	start, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		f.Close()
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Own process group: a Ctrl-C in the terminal reaches only us, and we
		// stop the children in order instead of all at once.
		Setpgid:   true,
		Pdeathsig: syscall.SIGKILL,
	}
	c := &child{name: name, cmd: cmd, logPath: logPath, logStart: start, logFile: f, exited: make(chan struct{})}
	if err := sp.start(cmd); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		c.exitErr = cmd.Wait()
		close(c.exited)
		if !c.stopping.Load() && onUnexpectedExit != nil {
			onUnexpectedExit(c)
		}
	}()
	return c, nil
}

func (c *child) hasExited() bool {
	select {
	case <-c.exited:
		return true
	default:
		return false
	}
}

// exitError describes an exit we did not ask for, with the end of the log,
// which is nearly always where the reason is.
func (c *child) exitError() error {
	status := "exited"
	if c.exitErr != nil {
		status = c.exitErr.Error()
	}
	return fmt.Errorf("%s stopped unexpectedly (%s); see %s%s", c.name, status, c.logPath, c.tailSection())
}

func (c *child) tailSection() string {
	t := c.tail(25)
	if t == "" {
		return ""
	}
	return fmt.Sprintf("\n--- last lines of %s ---\n%s", c.logPath, t)
}

// tail returns up to n lines that this run wrote to the log.
func (c *child) tail(n int) string {
	f, err := os.Open(c.logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return ""
	}
	from := max(c.logStart, end-16<<10)
	buf := make([]byte, end-from)
	if _, err := f.ReadAt(buf, from); err != nil && !errors.Is(err, io.EOF) {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(buf), "\n"), "\n")
	if from > c.logStart && len(lines) > 1 {
		lines = lines[1:] // the first line was cut by the 16 KiB window
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stop sends SIGTERM to the child's process group and waits up to grace
// before SIGKILL. It reports whether the kill was needed.
func (c *child) stop(grace time.Duration) (killed bool) {
	c.stopping.Store(true)
	defer c.logFile.Close()
	pgid := c.cmd.Process.Pid
	if !c.hasExited() {
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-c.exited:
		case <-time.After(grace):
			killed = true
		}
	}
	// Also catches anything the child left behind in its group.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-c.exited
	return killed
}
