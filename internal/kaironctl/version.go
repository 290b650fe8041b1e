package kaironctl

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Version is kaironctl's version. Release builds set it with
// -ldflags "-X github.com/zyvor/kairon/internal/kaironctl.Version=v0.1.0";
// otherwise it comes from the Go build information.
var Version = ""

func clientVersion() string {
	if Version != "" {
		return Version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	v := info.Main.Version
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += "+" + s.Value[:12]
		}
	}
	return v
}

func newVersionCommand(o *Options) *cobra.Command {
	var clientOnly bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the kaironctl version and the API server's",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprintf(o.Out, "Client Version: %s (%s, %s/%s)\n", clientVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
			if clientOnly {
				return nil
			}
			cs, err := o.Clientset()
			if err != nil {
				return err
			}
			info, err := cs.Discovery().ServerVersion()
			if err != nil {
				return fmt.Errorf("asking the API server for its version: %w (use --client for the client version only)", err)
			}
			fmt.Fprintf(o.Out, "Server Version: %s\n", info.GitVersion)
			return nil
		},
	}
	cmd.Flags().BoolVar(&clientOnly, "client", false, "Print the client version only, without contacting the API server")
	return cmd
}
