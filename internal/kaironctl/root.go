package kaironctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// verbs are the top-level commands, in the order help lists them. A new
// verb is a new file with a constructor added here.
var verbs = []func(*Options) *cobra.Command{
	newGetCommand,
	newDescribeCommand,
	newCreateCommand,
	newEditCommand,
	newDeleteCommand,
	newScaleCommand,
	newRolloutCommand,
	newClaimCommand,
	newReleaseCommand,
	newEvacuateCommand,
	newMigrateCommand,
	newRestoreCommand,
	newFenceCommand,
	newRecoverCommand,
	newMCPCommand,
	newLogsCommand,
	newExecCommand,
	newCpCommand,
	newConsoleCommand,
	newVersionCommand,
}

// Options is what every command shares: the kubeconfig flags, the output
// streams, and the clients built from them on first use.
type Options struct {
	ConfigFlags *genericclioptions.ConfigFlags
	// In is what exec -i and console send to the guest.
	In          io.Reader
	Out, ErrOut io.Writer
	// Now is the clock AGE columns are computed against.
	Now func() time.Time

	restConfig *rest.Config
	client     client.WithWatch
	clientset  kubernetes.Interface
}

// Main runs kaironctl with args (without the program name) and returns the
// process exit code: 0, or 1 after printing one "error: ..." line to stderr,
// or the exit code of the command `kaironctl exec` ran. Its stdin is
// os.Stdin.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return MainIO(ctx, args, os.Stdin, stdout, stderr)
}

// MainIO is Main with stdin.
func MainIO(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	o := &Options{
		ConfigFlags: genericclioptions.NewConfigFlags(true),
		In:          stdin,
		Out:         stdout,
		ErrOut:      stderr,
		Now:         time.Now,
	}
	root := NewRootCommand(o)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		var exit *ExitCodeError
		if errors.As(err, &exit) {
			if exit.Message != "" {
				fmt.Fprintln(stderr, "error: "+oneLine(exit.Message))
			}
			return exit.Code
		}
		fmt.Fprintln(stderr, "error: "+oneLine(err.Error()))
		return 1
	}
	return 0
}

// ExitCodeError ends kaironctl with Code (what a command run in a guest
// exited with), printing Message as the error line if there is one.
type ExitCodeError struct {
	Code    int
	Message string
}

func (e *ExitCodeError) Error() string {
	if e.Message != "" {
		return e.Message
	}
	return fmt.Sprintf("exit code %d", e.Code)
}

// NewRootCommand builds the whole command tree around o.
func NewRootCommand(o *Options) *cobra.Command {
	root := &cobra.Command{
		Use:   "kaironctl",
		Short: "kaironctl manages Kairon micro-VMs and the objects around them",
		Long: `kaironctl manages Kairon micro-VMs (Machines) and the objects around them.

It reads the kubeconfig exactly like kubectl: --kubeconfig, else $KUBECONFIG,
else ~/.kube/config; --context and -n/--namespace override the current context.

Kinds:
` + kindHelp(),
		SilenceErrors: true,
		SilenceUsage:  true,
		// Without a verb, print help; a stray word is an unknown command.
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("unknown command %q; commands: %s", args[0], commandNames(cmd))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	root.SetOut(o.Out)
	root.SetErr(o.ErrOut)
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%v (see '%s --help')", err, cmd.CommandPath())
	})
	o.ConfigFlags.AddFlags(root.PersistentFlags())
	for _, verb := range verbs {
		root.AddCommand(verb(o))
	}
	return root
}

func commandNames(root *cobra.Command) string {
	var names []string
	for _, c := range root.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	return strings.Join(names, ", ")
}

// oneLine folds a multi-line message (several joined errors, a server
// message with line breaks) into one line, parts separated by "; ".
func oneLine(s string) string {
	var parts []string
	for _, line := range strings.Split(s, "\n") {
		if line = strings.Join(strings.Fields(line), " "); line != "" {
			parts = append(parts, line)
		}
	}
	return strings.Join(parts, "; ")
}

// usageError is a mistake in the command line, as opposed to a failure
// talking to the server.
func usageError(cmd *cobra.Command, format string, args ...any) error {
	return fmt.Errorf("%s (see '%s --help')", fmt.Sprintf(format, args...), cmd.CommandPath())
}
