package caddyfairqueue

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "fair-queue",
		Usage: "status|purge|tenant-key [flags]",
		Short: "Shows the state of fair_queue queues, or clears a broken one",
		Long: `
Shows the live state of fair_queue queues, or clears a broken one.

  status  reads the admin endpoint of a running Caddy (--admin, default
          localhost:2019) and prints the queues it serves: permits,
          waiting requests, permits in flight, live instances, the head
          of the queue and the holders; a pool's upstreams (permits, in
          flight, cooling) and, with adaptive, the capacity in force of
          the configured permits. With --redis it reads Redis
          directly instead (every queue under --key-prefix, or --queue).

  purge   deletes every key of one queue in Redis, for an operator
          clearing a broken queue; it refuses to run without --yes. As
          after a Redis restart, live instances put back the permits they
          hold and the requests they have waiting at their next heartbeat
          (within a third of the lease); everything else is gone. With
          --dead, every queue that no instance has kept alive for a
          minute (--dead-for): the keys of queues whose instances all
          crashed, which nothing else deletes.

  tenant-key  reads a tenant value (an API key) on stdin and prints
          its key, sha256:<16 hex digits>, for a weight line that keeps
          the secret out of the config.

A password for --redis may come from the REDISCLI_AUTH environment
variable, to keep it out of the process list. Given a node of a Redis
Cluster, --redis works on the whole cluster.`,
		CobraFunc: setupFairQueueCommand,
	})
}

// cliTimeout bounds every call of the fair-queue command.
const cliTimeout = 5 * time.Second

func setupFairQueueCommand(cmd *cobra.Command) {
	status := &cobra.Command{
		Use:   "status",
		Short: "Prints the queues' live state as a table",
		Example: `  caddy fair-queue status
  caddy fair-queue status --admin localhost:2019 --queue chat
  caddy fair-queue status --redis redis://10.0.0.5:6379/0
  caddy fair-queue status --json`,
		Args: cobra.NoArgs,
		RunE: runStatus,
	}
	status.Flags().String("admin", "", "Address of the admin endpoint of a running Caddy (default $CADDY_ADMIN, else localhost:2019)")
	status.Flags().String("redis", "", "Read Redis directly: redis://[user@]host:port/db, rediss://... or unix:///path")
	status.Flags().StringSlice("queue", nil, "Only this queue (repeatable; one not found fails the command); with --redis the default is every queue found")
	status.Flags().String("key-prefix", redisstore.DefaultKeyPrefix, "Key prefix of the queues, with --redis")
	status.Flags().Bool("json", false, "Print the JSON of the admin API instead of a table")

	purge := &cobra.Command{
		Use:   "purge",
		Short: "Deletes every key of a queue in Redis",
		Example: `  caddy fair-queue purge --queue chat --redis redis://10.0.0.5:6379/0 --yes
  caddy fair-queue purge --dead --redis redis://10.0.0.5:6379/0 --yes`,
		Args: cobra.NoArgs,
		RunE: runPurge,
	}
	purge.Flags().String("queue", "", "Name of the queue to purge (required without --dead; with it, only this queue)")
	purge.Flags().String("redis", "", "Redis of the queue: redis://[user@]host:port/db, rediss://... or unix:///path (required)")
	purge.Flags().String("key-prefix", redisstore.DefaultKeyPrefix, "Key prefix of the queue")
	purge.Flags().Bool("yes", false, "Confirm: delete the queue's whole state in Redis")
	purge.Flags().Bool("dead", false, "Purge every queue under --key-prefix that no instance has kept alive for --dead-for (left by crashed instances)")
	purge.Flags().Duration("dead-for", time.Minute, "With --dead: how long a queue must have had no live instance")

	tenantKey := &cobra.Command{
		Use:   "tenant-key",
		Short: "Prints the key of a tenant value read from stdin, for a weight line",
		Long: `
Reads a tenant value (an API key, as the tenant option resolves it) on
stdin, so that it stays out of the process list and shell history, and
prints its key as weight takes it: sha256: and the first 16 hex digits
of the value's SHA-256, the hash access logs and the admin API show
(metrics have no tenant label). One trailing newline is dropped; the
value is cut at 1 KiB, as the handler cuts it.`,
		Example: `  printf '%s' "$API_KEY" | caddy fair-queue tenant-key`,
		Args:    cobra.NoArgs,
		RunE:    runTenantKey,
	}

	cmd.AddCommand(status, purge, tenantKey)
}

func runStatus(cmd *cobra.Command, _ []string) error {
	fl := cmd.Flags()
	admin, _ := fl.GetString("admin")
	rawURL, _ := fl.GetString("redis")
	queues, _ := fl.GetStringSlice("queue")
	prefix, _ := fl.GetString("key-prefix")
	asJSON, _ := fl.GetBool("json")
	if admin != "" && rawURL != "" {
		return errors.New("--admin and --redis are mutually exclusive")
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), cliTimeout)
	defer cancel()

	var rep statusReport
	var err error
	if rawURL != "" {
		rep, err = statusFromRedis(ctx, rawURL, prefix, queues)
	} else {
		rep, admin, err = statusFromAdmin(admin, queues)
	}
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if asJSON {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if _, err = out.Write(append(escapeJSONControls(b), '\n')); err != nil {
			return err
		}
	} else if len(rep.Queues) > 0 || len(queues) == 0 {
		// None of the queues named: the error below says so.
		if err := printStatus(out, rep); err != nil {
			return err
		}
	}
	if rawURL != "" {
		return unreadQueues(rep)
	}
	return unservedQueues(rep, queues, admin)
}

// unservedQueues fails status when a queue named with --queue is not
// among those the admin endpoint at addr serves (a mistyped name, or
// another Caddy's queue): the table printed the others, and "no queues"
// would read as a Caddy that serves none.
func unservedQueues(rep statusReport, queues []string, addr string) error {
	var missing []string
	for _, name := range queues {
		if !slices.ContainsFunc(rep.Queues, func(q queueReport) bool { return q.Name == name }) &&
			!slices.Contains(missing, strconv.Quote(name)) {
			missing = append(missing, strconv.Quote(name))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	what := "queue"
	if len(missing) > 1 {
		what = "queues"
	}
	return fmt.Errorf("%s %s not served by the Caddy at %s (status without --queue lists its queues)",
		what, strings.Join(missing, ", "), termText(addr))
}

// unreadQueues fails status --redis when a queue it was to read could
// not be read (Redis unreachable, another Cluster node serving it, an
// ACL): the tool failed, not an instance, so a script running it sees a
// non-zero exit, as when the queues cannot be listed. Each queue's line
// says why.
func unreadQueues(rep statusReport) error {
	failed := 0
	for _, q := range rep.Queues {
		if q.Error != "" {
			failed++
		}
	}
	if failed == 0 {
		return nil
	}
	return fmt.Errorf("could not read %d of %d queues in Redis", failed, len(rep.Queues))
}

// statusFromAdmin reads GET /fair_queue/ of a running Caddy; it
// returns the admin endpoint's address it read.
func statusFromAdmin(addr string, queues []string) (statusReport, string, error) {
	addr, err := caddycmd.DetermineAdminAPIAddress(addr, nil, "", "")
	if err != nil {
		return statusReport{}, addr, err
	}
	resp, err := caddycmd.AdminAPIRequest(addr, http.MethodGet, "/fair_queue/", nil, nil)
	if err != nil {
		return statusReport{}, addr, fmt.Errorf("reading the admin endpoint %s: %w", addr, err)
	}
	defer resp.Body.Close()
	var rep statusReport
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&rep); err != nil {
		return statusReport{}, addr, fmt.Errorf("decoding the answer of %s: %w", addr, err)
	}
	if len(queues) > 0 {
		rep.Queues = slices.DeleteFunc(rep.Queues, func(q queueReport) bool { return !slices.Contains(queues, q.Name) })
	}
	return rep, addr, nil
}

// statusFromRedis inspects queues in Redis directly: those named, or
// every queue found under prefix.
func statusFromRedis(ctx context.Context, rawURL, prefix string, queues []string) (statusReport, error) {
	rdb, desc, err := cliClient(ctx, rawURL)
	if err != nil {
		return statusReport{}, err
	}
	defer rdb.Close()
	named := len(queues) > 0
	if !named {
		if queues, err = listQueues(ctx, rdb, prefix); err != nil {
			return statusReport{}, explainRefusal(err, listRules(rdb, prefix))
		}
	}
	desc.KeyPrefix = prefix
	rep := statusReport{Queues: []queueReport{}}
	for _, name := range queues {
		q := queueReport{Name: name, storeDesc: desc}
		st := redisstore.New(rdb, name, redisstore.Options{KeyPrefix: prefix})
		var snap fairqueue.Snapshot
		err := error(nil)
		if named {
			err = hasKeys(ctx, rdb, st, prefix)
		}
		if err == nil {
			snap, err = st.Inspect(ctx, adminHead, adminFlows)
			err = explainRefusal(err, st.PermissionsNeeded())
		}
		if err != nil {
			q.Error = err.Error()
		} else {
			q.Snapshot = snapshotReport(snap, nil)
		}
		rep.Queues = append(rep.Queues, q)
	}
	return rep, nil
}

func runTenantKey(cmd *cobra.Command, _ []string) error {
	b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), maxTenantLen+2))
	if err != nil {
		return err
	}
	v := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	_, err = fmt.Fprintln(cmd.OutOrStdout(), weightHashPrefix+fairqueue.TenantKey(tenantValue(v)))
	return err
}

// printStatus writes rep as a summary table, then each queue's head and
// holders.
func printStatus(w io.Writer, rep statusReport) error {
	if len(rep.Queues) == 0 {
		_, err := fmt.Fprintln(w, "no queues")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tSTORE\tPERMITS\tWAITING\tIN FLIGHT\tNODES\tGRANTS")
	for _, q := range rep.Queues {
		permits := "-"
		if q.Permits > 0 {
			permits = fmt.Sprint(q.Permits)
		}
		waiting, inFlight, nodes, grants := "?", "?", "?", "?"
		if s := q.Snapshot; s != nil {
			alive := 0
			for _, n := range s.Nodes {
				if n.Alive {
					alive++
				}
			}
			waiting, inFlight = fmt.Sprint(s.Waiting), fmt.Sprint(len(s.Holders))
			nodes, grants = fmt.Sprint(alive), fmt.Sprint(s.Grants)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", termCell(q.Name), storeLabel(q), permits, waiting, inFlight, nodes, grants)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, q := range rep.Queues {
		if err := printQueueDetail(w, q); err != nil {
			return err
		}
	}
	return nil
}

func printQueueDetail(w io.Writer, q queueReport) error {
	s := q.Snapshot
	if s == nil {
		_, err := fmt.Fprintf(w, "\n%s: %s\n", termCell(q.Name), termText(cmp.Or(q.Error, "no state")))
		return err
	}
	if len(s.Head) == 0 && len(s.Holders) == 0 && q.KV == nil && len(s.Upstreams) == 0 && !learned(s.LearnedShare) {
		return nil
	}
	fmt.Fprintf(w, "\n%s\n", termCell(q.Name))
	printLearnedCapacity(w, q)
	if kv := q.KV; kv != nil {
		if kv.Capacity > 0 {
			fmt.Fprintf(w, "  kv tokens: %d held of %d\n", kv.TokensHeld, kv.Capacity)
		}
		fmt.Fprintf(w, "  prompt estimate: %.2f bytes per token, from %d answers\n", kv.BytesPerToken, kv.Samples)
		if kv.CompletionBudget > 0 {
			fmt.Fprintf(w, "  completion budget: %d tokens, from %d answers\n", kv.CompletionBudget, kv.CompletionSamples)
		}
	}
	if err := printUpstreams(w, s.Upstreams); err != nil {
		return err
	}
	if len(s.Head) > 0 {
		head := make([]string, len(s.Head))
		for i, t := range s.Head {
			head[i] = termCell(t)
		}
		fmt.Fprintf(w, "  head (next %d of %d waiting): %s\n", len(s.Head), s.Waiting, strings.Join(head, " "))
	}
	if len(s.Holders) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  HOLDER\tNODE\tLEASE LEFT")
	for _, h := range s.Holders {
		left := (time.Duration(h.LeaseLeftMS) * time.Millisecond).Round(100 * time.Millisecond)
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", termCell(h.Ticket), termCell(h.Node), left)
	}
	return tw.Flush()
}

// storeLabel names a queue's store in one column: "local", or
// "redis host:port/db", with the key prefix when it is not the default.
func storeLabel(q queueReport) string {
	if q.Store != "redis" {
		return termCell(q.Store)
	}
	s := fmt.Sprintf("redis %s/%d", termCell(q.Address), q.DB)
	if q.KeyPrefix != "" && q.KeyPrefix != redisstore.DefaultKeyPrefix {
		s += " prefix=" + termCell(q.KeyPrefix)
	}
	return s
}

// termText is s for a terminal: as it is when every rune is printable
// (strconv.IsPrint), else quoted with Go's escapes, so that a string a
// client chose (a queue name from a placeholder, an error naming it)
// cannot move the cursor, clear the screen, retitle the terminal or
// start a line of its own.
func termText(s string) string {
	if printable(s) {
		return s
	}
	return strconv.Quote(s)
}

// termCell is s for one cell of a table or list: termText, and quoted
// as well when it is empty or holds a space or a double quote, so that
// it reads as one cell and a quoted name is never taken for an escaped
// one.
func termCell(s string) string {
	if s == "" || strings.ContainsAny(s, ` "`) || !printable(s) {
		return strconv.Quote(s)
	}
	return s
}

// printable reports whether s is valid UTF-8 of printable runes only
// (no control or format character, no space but ASCII's).
func printable(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || !strconv.IsPrint(r) {
			return false
		}
	}
	return true
}

// escapeJSONControls rewrites, in the JSON b, every rune that is not
// printable and that encoding/json leaves as it is (DEL, C1 controls such
// as the 8-bit CSI, bidi overrides and other format characters) as a
// \u escape. Such runes occur only inside JSON strings, so the JSON
// means the same; a terminal shown it acts on none.
func escapeJSONControls(b []byte) []byte {
	if printable(string(b)) {
		return b
	}
	out := make([]byte, 0, len(b)+32)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		switch {
		case r < utf8.RuneSelf && r != 0x7f, strconv.IsPrint(r):
			out = append(out, b[:n]...)
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		b = b[n:]
	}
	return out
}
