package cli

import (
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/api/sandboxes"
)

// sandboxCmd is `better-compute sandbox exec`: sandboxes.exec, then its
// tunnel run with this process's stdio (stdin only with -i, as docker
// exec); the exit status is the command's.
func sandboxCmd(o Options) *cobra.Command {
	root := &cobra.Command{Use: "sandbox", Short: "Work in a sandbox (exec)", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() }}
	var contextName, tenant, cwd string
	var env []string
	var timeout int
	var stdin bool
	exec := &cobra.Command{
		Use:   "exec SANDBOX_ID [flags] -- COMMAND [ARG...]",
		Short: "Run a command in a sandbox, its output streamed",
		Long: "Run a command in a running sandbox (sandboxes.exec) and stream its stdout and stderr here; with -i,\n" +
			"this process's stdin is its stdin. The exit status is the command's (124 when it timed out).",
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 {
				return usageErrorf("give the sandbox id, then -- and the command")
			}
			vars := map[string]string{}
			for _, kv := range env {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return usageErrorf("--env %q is not NAME=VALUE", kv)
				}
				vars[k] = v
			}
			client, conn, err := Connect(o, contextName)
			if err != nil {
				return err
			}
			if tenant == "" {
				tenant = conn.Tenant
			}
			if tenant == "" {
				return usageErrorf("no tenant: give --tenant-id, set %s, or log in with --tenant", EnvTenant)
			}
			in := sandboxes.ExecInput{TenantID: tenant, SandboxID: args[0], Command: args[1:], Cwd: cwd, TimeoutSeconds: timeout}
			if len(vars) > 0 {
				in.Env = vars
			}
			opened, err := sandboxes.Exec.Call(cmd.Context(), client, in)
			if err != nil {
				return err
			}
			var input io.Reader = strings.NewReader("")
			if stdin {
				input = o.stdin()
			}
			return RunExec(cmd.Context(), client, opened, input, o.Stdout, o.Stderr)
		},
	}
	f := exec.Flags()
	f.BoolVarP(&stdin, "stdin", "i", false, "send this process's stdin to the command")
	f.StringArrayVar(&env, "env", nil, "NAME=VALUE for the command's environment (repeatable)")
	f.StringVar(&cwd, "cwd", "", "the command's working directory (absolute)")
	f.IntVar(&timeout, "timeout-seconds", 0, "kill the command after this long (default 60, at most 3600)")
	f.StringVar(&tenant, "tenant-id", "", "the tenant (default: the context's)")
	f.StringVar(&contextName, "context", "", "the configuration context to use (default: the current one)")
	_ = exec.RegisterFlagCompletionFunc("context", o.completeContexts)
	root.AddCommand(exec)
	return root
}
