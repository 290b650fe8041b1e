package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/zyvor/kairon/internal/guestagent/wire"
)

// An image's main process: its Entrypoint and Cmd, run once per boot by
// kairon-guest-agent main, which the guest's init starts once, apart from
// the agent that serves the host (and is started again whenever it ends),
// so that an agent's restart never runs it again. It runs as the image's
// user, in its working directory, with its environment, its output on the
// serial console. What became of it is kept in a state file that only root
// writes (wire.MainProcess as JSON); every ping reports it (Status.Main).

// maxMainStateBytes bounds the state file the agent reads.
const maxMainStateBytes = 4096

// RunMain runs img's main process, with stdout and stderr as its output,
// and records its state in stateFile: running once it started, exited
// when it ended (127 if its program is not in the image, 126 if it could
// not start). An image with no main process records nothing. It returns
// the main process's state at its end; an error only if the state could
// not be recorded.
func RunMain(img *Image, stdout, stderr io.Writer, stateFile string) (*wire.MainProcess, error) {
	args := img.Config.MainArgs()
	if len(args) == 0 {
		return nil, nil
	}
	exited := func(code int, why error) (*wire.MainProcess, error) {
		fmt.Fprintf(stderr, "kairon: the image's main process %q: %v\n", clipText(args[0], 256), why)
		m := &wire.MainProcess{State: wire.MainExited, ExitCode: code}
		return m, writeMainState(stateFile, m)
	}
	cmd, err := img.Command(args, nil, "", "", false)
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return exited(127, err)
		}
		return exited(126, err)
	}
	cmd.Stdin = nil // /dev/null
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// Its own session: signals for the console's shell do not reach it.
	cmd.SysProcAttr.Setsid = true
	if err := cmd.Start(); err != nil {
		code := 126
		if errors.Is(err, os.ErrNotExist) {
			code = 127
		}
		return exited(code, err)
	}
	if err := writeMainState(stateFile, &wire.MainProcess{State: wire.MainRunning}); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, err
	}
	_ = cmd.Wait()
	m := mainExit(cmd.ProcessState)
	return m, writeMainState(stateFile, m)
}

// mainExit is how the process of st ended.
func mainExit(st *os.ProcessState) *wire.MainProcess {
	m := &wire.MainProcess{State: wire.MainExited}
	ws, ok := st.Sys().(syscall.WaitStatus)
	switch {
	case ok && ws.Signaled():
		m.ExitCode = -1
		m.Signal = signalNames[ws.Signal()]
		if m.Signal == "" {
			m.Signal = "SIG" + strconv.Itoa(int(ws.Signal()))
		}
	case ok:
		m.ExitCode = ws.ExitStatus()
	default:
		m.ExitCode = st.ExitCode()
	}
	return m
}

// writeMainState replaces stateFile with m, whole (write, then rename).
func writeMainState(stateFile string, m *wire.MainProcess) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	dir := filepath.Dir(stateFile)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(stateFile)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), stateFile)
}

// readMainState is what stateFile says, or nil when there is none (no main
// process) or it does not hold a valid state.
func readMainState(stateFile string) *wire.MainProcess {
	f, err := os.Open(stateFile)
	if err != nil {
		return nil
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxMainStateBytes+1))
	if err != nil || len(b) > maxMainStateBytes {
		return nil
	}
	var m wire.MainProcess
	if json.Unmarshal(b, &m) != nil || m.Validate() != nil {
		return nil
	}
	return &m
}
