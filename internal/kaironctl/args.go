package kaironctl

import "github.com/spf13/cobra"

// oneArg checks that a command got exactly one non-empty positional
// argument and returns it. verb names the command as the user typed it
// ("migrate", "create budget") and what names the argument ("MACHINE",
// "NODE"), so every command refuses a missing, extra or empty argument in
// the same words.
func oneArg(cmd *cobra.Command, verb, what string, args []string) (string, error) {
	switch {
	case len(args) == 0:
		return "", usageError(cmd, "%s needs a %s", verb, what)
	case len(args) > 1:
		return "", usageError(cmd, "%s takes one %s, got %d arguments", verb, what, len(args))
	case args[0] == "":
		return "", usageError(cmd, "%s must not be empty", what)
	}
	return args[0], nil
}
