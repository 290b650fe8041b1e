package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

const nodeUsage = `Usage: kairon-local node stop|kill|start NODE [--data-dir DIR]

Takes one node of a running kairon-local down, or brings it back:

  stop   its agent saves its VMs and stops, as Ctrl-C does for all of them
  kill   its agent is killed (SIGKILL); its VMs run on, unmanaged: to the
         cluster, a host that died. The Node goes Unknown after the grace
         period (up --node-grace-period); see docs/guides/node-failure.md
  start  its agent starts again, adopts the VMs it finds (and resumes those
         it saved), and the command returns once the Node is Ready

Flags:
`

func nodeCommand(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kairon-local node", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dataDir := fs.String("data-dir", ".kairon", "the data dir of the running kairon-local")
	fs.Usage = func() {
		fmt.Fprint(stderr, nodeUsage)
		fs.PrintDefaults()
	}
	// Flags may come before, between or after the two arguments.
	var positional []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if len(positional) != 2 {
		fmt.Fprintf(stderr, "kairon-local node: want an action and a node, got %d argument(s)\n\n", len(positional))
		fs.Usage()
		return 2
	}
	action, node := positional[0], positional[1]
	if !slices.Contains(nodeActions, action) {
		fmt.Fprintf(stderr, "kairon-local node: unknown action %q: one of %s\n", action, strings.Join(nodeActions, ", "))
		return 2
	}
	dir, err := filepath.Abs(*dataDir)
	if err != nil {
		fmt.Fprintf(stderr, "kairon-local node: %v\n", err)
		return 1
	}
	msg, err := sendNodeCommand(dir, action, node)
	if err != nil {
		fmt.Fprintf(stderr, "kairon-local node %s %s: %v\n", action, node, err)
		return 1
	}
	fmt.Fprint(stdout, msg)
	return 0
}

// sendNodeCommand asks the up running on dataDir to act on node.
func sendNodeCommand(dataDir, action, node string) (string, error) {
	sock := controlSocket(dataDir)
	c := &http.Client{
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}},
		// A stop saves the VMs (up to two minutes), a start waits for Ready.
		Timeout: suspendTimeout + time.Minute,
	}
	resp, err := c.Post("http://kairon-local/nodes/"+node+"/"+action, "text/plain", nil)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return "", fmt.Errorf("no kairon-local up runs on %s (no one listens on %s)", dataDir, sock)
		}
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", errors.New(strings.TrimSpace(string(body)))
	}
	return string(body), nil
}
