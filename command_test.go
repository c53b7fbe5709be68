package caddyfairqueue

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// runCLI runs `caddy fair-queue <args>` and returns what it printed.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := &cobra.Command{Use: "fair-queue", SilenceUsage: true, SilenceErrors: true}
	setupFairQueueCommand(root)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// adminJSON is what GET /fair_queue/ could answer: a Redis queue with a
// backlog, a local one, and one whose Redis is down.
const adminJSON = `{"queues":[
 {"name":"chat","store":"redis","mode":"standalone","address":"10.0.0.5:6379","db":0,"key_prefix":"fair_queue",
  "permits":4,"max_wait_ms":20000,"lease_ms":30000,"node":"9f2c1a0b3d4e5f60",
  "stats":{"waiting":2,"in_flight":2,"store_up":true,"grants":1830},
  "cluster":{"waiting":3,"in_flight":4,"nodes":2},
  "snapshot":{"waiting":3,"head":["9f2c1a0b3d4e5f60:118","3b7e10aa55cc0d12:41","9f2c1a0b3d4e5f60:119"],
   "holders":[{"ticket":"3b7e10aa55cc0d12:37","node":"3b7e10aa55cc0d12","lease_left_ms":4120},
              {"ticket":"9f2c1a0b3d4e5f60:114","node":"9f2c1a0b3d4e5f60","lease_left_ms":27433}],
   "nodes":[{"id":"9f2c1a0b3d4e5f60","alive":true,"expires_in_ms":29000},{"id":"3b7e10aa55cc0d12","alive":true,"expires_in_ms":21000},
            {"id":"0d0d0d0d0d0d0d0d","alive":false,"expires_in_ms":-5000}],
   "flows":[],"grants":1832},
  "kv":{"bytes_per_token":3.87,"samples":120,"capacity":200000,"tokens_held":151200,"node_tokens_held":75300}},
 {"name":"embed","store":"local","permits":2,"max_wait_ms":20000,"lease_ms":30000,"node":"77aa00bb11cc22dd",
  "stats":{"waiting":0,"in_flight":0,"store_up":true,"grants":0},
  "snapshot":{"waiting":0,"head":[],"holders":[],"nodes":[],"flows":[],"grants":0}},
 {"name":"vision","store":"redis","mode":"standalone","address":"10.0.0.5:6379","db":1,"key_prefix":"llm",
  "permits":1,"max_wait_ms":20000,"lease_ms":30000,"node":"55ee66ff77aa88bb",
  "stats":{"waiting":0,"in_flight":0,"store_up":false,"grants":0},
  "error":"inspect {llm:vision}: dial tcp 10.0.0.5:6379: connect: connection refused"}
]}`

const wantStatusTable = `QUEUE   STORE                             PERMITS  WAITING  IN FLIGHT  NODES  GRANTS
chat    redis 10.0.0.5:6379/0             4        3        2          2      1832
embed   local                             2        0        0          0      0
vision  redis 10.0.0.5:6379/1 prefix=llm  1        ?        ?          ?      ?

chat
  kv tokens: 151200 held of 200000
  prompt estimate: 3.87 bytes per token, from 120 answers
  head (next 3 of 3 waiting): 9f2c1a0b3d4e5f60:118 3b7e10aa55cc0d12:41 9f2c1a0b3d4e5f60:119
  HOLDER                NODE              LEASE LEFT
  3b7e10aa55cc0d12:37   3b7e10aa55cc0d12  4.1s
  9f2c1a0b3d4e5f60:114  9f2c1a0b3d4e5f60  27.4s

vision: inspect {llm:vision}: dial tcp 10.0.0.5:6379: connect: connection refused
`

// fakeAdmin serves body on GET /fair_queue/ and returns its address.
func fakeAdmin(t *testing.T, body string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/fair_queue/" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func TestFairQueueCommandIsRegisteredWithCaddy(t *testing.T) {
	cmd, ok := caddycmd.Commands()["fair-queue"]
	require.True(t, ok)
	assert.NotNil(t, cmd.CobraFunc)
}

func TestStatusPrintsATableFromTheAdminAPI(t *testing.T) {
	out, err := runCLI(t, "status", "--admin", fakeAdmin(t, adminJSON))
	require.NoError(t, err)
	assert.Equal(t, wantStatusTable, out)
}

func TestStatusFiltersQueuesAndPrintsJSON(t *testing.T) {
	out, err := runCLI(t, "status", "--admin", fakeAdmin(t, adminJSON), "--queue", "embed", "--json")
	require.NoError(t, err)
	assert.JSONEq(t, `{"queues":[{"name":"embed","store":"local","permits":2,"max_wait_ms":20000,"lease_ms":30000,
		"node":"77aa00bb11cc22dd","stats":{"waiting":0,"in_flight":0,"store_up":true,"grants":0},
		"snapshot":{"waiting":0,"head":[],"holders":[],"nodes":[],"flows":[],"grants":0}}]}`, out)
}

func TestStatusSaysSoWhenNoQueueIsServed(t *testing.T) {
	out, err := runCLI(t, "status", "--admin", fakeAdmin(t, `{"queues":[]}`))
	require.NoError(t, err)
	assert.Equal(t, "no queues\n", out)
}

func TestStatusReportsAnUnreachableAdminEndpoint(t *testing.T) {
	_, err := runCLI(t, "status", "--admin", deadAddr(t))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "admin endpoint")
}

// seedQueue gives queue name in rds one holder and one waiter, as a node
// of a running Caddy would, and returns the store.
func seedQueue(t *testing.T, rds *redistest.Server, name string) *redisstore.Store {
	t.Helper()
	st := redisstore.New(rds.Client(t), name, redisstore.Options{})
	ctx := context.Background()
	l := fairqueue.Limits{Permits: 1, Lease: time.Minute}
	for _, id := range []string{"n1:1", "n1:2"} {
		_, err := st.Acquire(ctx, fairqueue.TicketArgs{ID: id, Node: "n1", Limits: l})
		require.NoError(t, err)
	}
	return st
}

func TestStatusReadsRedisDirectlyAndFindsItsQueues(t *testing.T) {
	rds := redistest.Start(t)
	seedQueue(t, rds, "chat")
	seedQueue(t, rds, "embed")

	out, err := runCLI(t, "status", "--redis", "redis://"+rds.Addr()+"/0")
	require.NoError(t, err)
	lines := strings.Split(out, "\n")
	require.GreaterOrEqual(t, len(lines), 3)
	assert.Regexp(t, `^chat\s+redis `+rds.Addr()+`/0\s+-\s+1\s+1\s+1\s+1$`, lines[1], "permits are unknown in Redis")
	assert.Regexp(t, `^embed\s+redis `, lines[2])
	assert.Contains(t, out, "head (next 1 of 1 waiting): n1:2")
	assert.Regexp(t, `(?m)^  n1:1\s+n1\s+(59\.\ds|1m0s)$`, out, "the holder with its lease left")

	out, err = runCLI(t, "status", "--redis", "redis://"+rds.Addr()+"/0", "--queue", "embed")
	require.NoError(t, err)
	assert.NotContains(t, out, "chat")
}

func TestStatusRefusesAdminAndRedisTogether(t *testing.T) {
	_, err := runCLI(t, "status", "--admin", "localhost:2019", "--redis", "redis://localhost:6379")
	require.ErrorContains(t, err, "mutually exclusive")
}

func TestPurgeRefusesWithoutYes(t *testing.T) {
	rds := redistest.Start(t)
	st := seedQueue(t, rds, "broken")
	before := rds.Keys(t, st.Tag()+"*")
	require.NotEmpty(t, before)

	out, err := runCLI(t, "purge", "--queue", "broken", "--redis", "redis://"+rds.Addr())
	require.Error(t, err)
	assert.Contains(t, err.Error(), `refusing to purge queue "broken" without --yes`)
	assert.Empty(t, out)
	assert.Equal(t, before, rds.Keys(t, st.Tag()+"*"), "nothing was deleted")

	_, err = runCLI(t, "purge", "--redis", "redis://"+rds.Addr(), "--yes")
	assert.ErrorContains(t, err, "--queue is required")
	_, err = runCLI(t, "purge", "--queue", "broken", "--yes")
	assert.ErrorContains(t, err, "--redis is required")
}

func TestPurgeWithYesDeletesEveryKeyOfThatQueueOnly(t *testing.T) {
	rds := redistest.Start(t)
	st := seedQueue(t, rds, "broken")
	other := seedQueue(t, rds, "healthy")
	kept := rds.Keys(t, other.Tag()+"*")

	out, err := runCLI(t, "purge", "--queue", "broken", "--redis", "redis://"+rds.Addr()+"/0", "--yes")
	require.NoError(t, err)
	assert.Equal(t, "purged queue \"broken\" (keys {fair_queue:broken}*): 1 waiting, 1 holders; "+
		"live instances put back their own at their next heartbeat\n", out)
	assert.Empty(t, rds.Keys(t, st.Tag()+"*"), "every key of the queue is gone")
	assert.Equal(t, kept, rds.Keys(t, other.Tag()+"*"), "other queues are untouched")
}

func TestCLIRedisTakesThePasswordFromTheEnvironment(t *testing.T) {
	t.Setenv("REDISCLI_AUTH", "s3cret")
	rdb, err := cliRedis("redis://localhost:6379/2")
	require.NoError(t, err)
	defer rdb.Close()
	assert.Equal(t, "s3cret", rdb.Options().Password)
	assert.Equal(t, 2, rdb.Options().DB)
	assert.Equal(t, 2*time.Second, rdb.Options().ReadTimeout)

	_, err = cliRedis("redis://u:p@host:notaport/0")
	require.Error(t, err)
	assert.NotContains(t, err.Error(), ":p@", "the URL, and its password, are not echoed")
}

// hostileName is a queue name a client chose through a placeholder: it
// clears the screen, retitles the terminal, fakes a table row, and tries
// an 8-bit CSI and a right-to-left override.
const hostileName = "\x1b[2J\x1b[H\x1b]0;pwned\x07chat\r\nembed   local   2   0   0   0   0\n\u009b31m\u202egpj"

// hostileAdminJSON is an admin API answer whose strings came from a client.
func hostileAdminJSON(t *testing.T) string {
	t.Helper()
	name, err := json.Marshal(hostileName)
	require.NoError(t, err)
	n := string(name)
	return `{"queues":[
 {"name":` + n + `,"store":"local","permits":1,"snapshot":{"waiting":1,"head":[` + n + `],
   "holders":[{"ticket":` + n + `,"node":"a b","lease_left_ms":1000}],"nodes":[],"flows":[],"grants":0}},
 {"name":"plain-name","store":"redis","address":` + n + `,"db":0,"key_prefix":"x\ty","permits":1,"error":` + n + `}]}`
}

// assertTerminalSafe fails when out holds a byte or rune that a terminal
// acts on rather than prints: C0 controls but the newline, DEL, C1
// controls and format characters such as bidi overrides.
func assertTerminalSafe(t *testing.T, out string) {
	t.Helper()
	for i, r := range out {
		if r != '\n' && r != ' ' && (r < 0x21 || r >= 0x7f) && (r <= 0x9f || !unicode.IsGraphic(r)) {
			assert.Failf(t, "a control reaches the terminal", "rune %U at %d of %q", r, i, out)
			return
		}
	}
}

func TestStatusEscapesClientStringsInTheTable(t *testing.T) {
	out, err := runCLI(t, "status", "--admin", fakeAdmin(t, hostileAdminJSON(t)))
	require.NoError(t, err)
	assertTerminalSafe(t, out)
	q := regexp.QuoteMeta(strconv.Quote(hostileName))
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	want := []string{
		`^QUEUE +STORE +PERMITS +WAITING +IN FLIGHT +NODES +GRANTS$`,
		`^` + q + ` +local +1 +1 +1 +0 +0$`,
		`^plain-name +redis ` + q + `/0 prefix="x\\ty" +1 +\? +\? +\? +\?$`,
		`^$`,
		`^` + q + `$`,
		`^  head \(next 1 of 1 waiting\): ` + q + `$`,
		`^  HOLDER +NODE +LEASE LEFT$`,
		`^  ` + q + ` +"a b" +1s$`,
		`^$`,
		`^plain-name: ` + q + `$`,
	}
	require.Len(t, lines, len(want), "no string adds a line: %q", out)
	for i, re := range want {
		assert.Regexp(t, re, lines[i], "line %d", i)
	}
}

func TestStatusKeepsOrdinaryNamesReadable(t *testing.T) {
	out, err := runCLI(t, "status", "--admin", fakeAdmin(t, adminJSON))
	require.NoError(t, err)
	assert.Equal(t, wantStatusTable, out, "printable names and errors are printed as they are")
}

func TestStatusJSONEscapesEveryControlCharacter(t *testing.T) {
	out, err := runCLI(t, "status", "--admin", fakeAdmin(t, hostileAdminJSON(t)), "--json")
	require.NoError(t, err)
	assertTerminalSafe(t, out)
	var rep statusReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), "still valid JSON: %s", out)
	assert.Equal(t, hostileName, rep.Queues[0].Name, "and the same strings")
}

func TestStatusFromRedisEscapesAQueueNameAClientChose(t *testing.T) {
	rds := redistest.Start(t)
	seedQueue(t, rds, hostileName)
	out, err := runCLI(t, "status", "--redis", "redis://"+rds.Addr()+"/0")
	require.NoError(t, err)
	assertTerminalSafe(t, out)
	assert.Contains(t, out, strconv.Quote(hostileName)+"  redis ")
	assert.Len(t, strings.Split(strings.TrimSuffix(out, "\n"), "\n"), 7, "the table, the queue's head and its holder: %q", out)
}

func TestTenantKeyPrintsTheWeightKeyOfAValueOnStdin(t *testing.T) {
	for _, in := range []string{"Bearer sk-live-gold", "Bearer sk-live-gold\n", "Bearer sk-live-gold\r\n"} {
		root := &cobra.Command{Use: "fair-queue", SilenceUsage: true, SilenceErrors: true}
		setupFairQueueCommand(root)
		var out bytes.Buffer
		root.SetIn(strings.NewReader(in))
		root.SetOut(&out)
		root.SetArgs([]string{"tenant-key"})
		require.NoError(t, root.ExecuteContext(context.Background()))
		assert.Equal(t, goldKey+"\n", out.String(), "input %q", in)
	}
}
