package caddyfairqueue

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"

	"github.com/fair-queue/caddy-fair-queue/internal/jsonscan"
)

// The names a handler serves (Names): a queue name resolved from the
// request that the operator did not list is answered at once, before any
// queue is opened, so that names a client makes up cost no queue slot,
// no engine and no store keys.

// unknownQueue stands in logs and metrics for a queue name that Names
// does not list: the name is client input.
const unknownQueue = "(unknown)"

// outcomeUnknownName is the outcome (and reason) of a request whose
// queue name Names does not list; also the code of its 404 answer, as
// OpenAI answers an unknown model.
const outcomeUnknownName = "model_not_found"

// outcomeNoModel is the outcome (and reason) of a request that names no
// model where Names lists the models served, and the code of its 400
// answer.
const outcomeNoModel = "model_missing"

// errNamesNeedPlaceholders: Names with a fixed Name.
var errNamesNeedPlaceholders = optErr("names requires a name with placeholders (such as {http.fair_queue.model})",
	"names", "requires a name with placeholders in name (such as {http.fair_queue.model})")

// checkNames is the rule of Names: each name once, 1 to maxQueueNameLen
// bytes of valid UTF-8 (a name resolved from a request is made valid
// UTF-8, so another could never match), neither (overflow) nor (unknown)
// (refused from a request, see call.enter). An error names the name's
// entry in JSON (names[2]).
func checkNames(names []string) error {
	seen := make(map[string]bool, len(names))
	for i, n := range names {
		var msg string
		switch {
		case n == "":
			msg = fmt.Sprintf("an empty name (a name that resolves to nothing is %q)", DefaultName)
		case len(n) > maxQueueNameLen:
			msg = fmt.Sprintf("a name is longer than %d bytes", maxQueueNameLen)
		case !utf8.ValidString(n):
			msg = fmt.Sprintf("%q is not valid UTF-8", n)
		case n == overflowQueue || n == unknownQueue:
			msg = fmt.Sprintf("%q is reserved (the label of requests refused without a queue)", n)
		case seen[n]:
			msg = fmt.Sprintf("%q is listed twice", n)
		}
		if msg != "" {
			return optErr("names: "+msg, "names["+strconv.Itoa(i)+"]", msg)
		}
		seen[n] = true
	}
	return nil
}

// nameSet returns Names as a set; nil without Names (every name served).
func nameSet(names []string) map[string]bool {
	if len(names) == 0 {
		return nil
	}
	set := make(map[string]bool, len(names))
	for _, n := range names {
		set[n] = true
	}
	return set
}

// serves reports whether the handler serves queue name.
func (h *Handler) serves(name string) bool {
	return h.names == nil || h.names[name]
}

// notServed answers a request whose queue name Names does not list:
// 404 model_not_found, or, where the queue is named from the model and
// the request names none, 400 model_missing, saying what it lacks.
func (c *call) notServed() error {
	if c.noModel != "" {
		c.h.record(c.r, c.repl, unknownQueue, outcomeNoModel, outcomeNoModel, 0, 0)
		body := c.api.errorBody("The request names no model: "+c.noModel+".", "invalid_request_error", outcomeNoModel)
		_ = writeJSON(c.w, http.StatusBadRequest, body)
		return nil
	}
	c.h.record(c.r, c.repl, unknownQueue, outcomeUnknownName, outcomeUnknownName, 0, 0)
	body := c.api.errorBody("The model this request names is not served here.", "invalid_request_error", outcomeUnknownName)
	_ = writeJSON(c.w, http.StatusNotFound, body)
	return nil
}

// nameQueue sets the request's tenant, weight and priority (c.req) and
// its queue name, from the request's placeholders. Where the queue name
// takes the model's other spelling (queueName), the tenant, weight and
// priority templates are read again: they see the model as the queue
// name and the handlers after do. With Names, where the name is the
// model's, it notes why a request of body names no model (c.noModel).
func (c *call) nameQueue(info jsonscan.Fields, body []byte) {
	c.req = c.h.fairRequest(c.repl, info)
	var respelled bool
	if c.name, respelled = c.h.queueName(c.repl, c.api, info.Model); respelled {
		c.req = c.h.fairRequest(c.repl, info)
	}
	if c.h.names != nil && info.Model == "" && strings.Contains(c.h.Name, "{"+phModel+"}") {
		c.noModel = noModel(c.api, body)
	}
}

// noModel says why a request of a whose body sets no "model" names none.
func noModel(a api, body []byte) string {
	switch {
	case len(bytes.TrimSpace(body)) == 0:
		return "it has no body"
	case !jsonscan.Object(body, a.ollama()):
		return "its body is not a JSON object"
	}
	return `its JSON body has no "model" string`
}

// queueName is the queue name h.Name resolves to for a request of a
// whose body names model (repl holds its placeholders): with
// placeholders, valid UTF-8 (the name may come from client input, and
// logs and metric labels require it), DefaultName where it resolves to
// nothing. On Ollama's native API, where Names lists the model without
// its tag ("llama3", which Ollama reads as "llama3:latest", the name the
// model placeholder takes), the queue of that spelling: one queue for
// either, and the placeholder is set to it (respelled).
func (h *Handler) queueName(repl *caddy.Replacer, a api, model string) (name string, respelled bool) {
	if !h.dynamic {
		return h.Name, false
	}
	name = h.resolveName(repl)
	if untagged, ok := ollamaUntagged(model); ok && a.ollama() && !h.serves(name) {
		repl.Set(phModel, untagged)
		if n := h.resolveName(repl); h.serves(n) {
			return n, true
		}
		repl.Set(phModel, a.modelName(model))
	}
	return name, false
}

// resolveName is h.Name with repl's placeholders replaced: valid UTF-8,
// DefaultName where it resolves to nothing.
func (h *Handler) resolveName(repl *caddy.Replacer) string {
	if n := strings.ToValidUTF8(repl.ReplaceAll(h.Name, ""), "\uFFFD"); n != "" {
		return n
	}
	return DefaultName
}
