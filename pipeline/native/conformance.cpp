// ggufpipe-conformance: what llama.cpp itself makes of a GGUF's vocabulary and chat template.
//
// usage: ggufpipe-conformance MODEL.gguf < requests.json
//
// Built by pipeline/tools.py as one more target of the pinned llama.cpp tree (b11312, commit 0c1e570):
// install() writes this file to examples/ggufpipe-conformance/ and links it against llama-common and llama,
// like tools/tokenize. Only llama.cpp's own API is used; file:line references are to that tree.
//
// stdin: a JSON list of requests; stdout: a JSON list with one answer per request, in the same order.
//   {"op":"vocab"}
//     -> {"n_tokens", "type" (none/spm/bpe/wpm/ugm/rwkv/plamo2/test), "bos", "eos", "eot", "eom", "sep", "pad",
//         "fim_pad", "fim_rep", "fim_sep" (ids or null), "add_bos", "add_eos", "add_sep",
//         "eog": [ids with llama_vocab_is_eog, ascending], "pieces_of_specials": {"id": piece, ...}}
//   {"op":"tokenize", "text": s, "add_special": b, "parse_special": b}
//     -> {"ids": [...], "pieces": [common_token_to_piece(id, special=true) ...]}
//   {"op":"detokenize", "ids": [...], "special": b (default true)}
//     -> {"text": common_detokenize(ids, special)}
//   {"op":"render", "messages": [...], "tools": [...]?, "add_generation_prompt": b (default true),
//    "chat_template_kwargs": {...}?, "template": s?, "enable_thinking": b?, "pure": b (default false)}
//     -> {"prompt": s} or {"error": s}
// A request that cannot be answered gets {"error": "one line"}, and the next request is answered.
// Strings are UTF-8; a byte that is not part of valid UTF-8 (a piece that ends inside a character) is written
// as the escape \udcXX (XX = the byte), so that Python's json.loads(...)[...].encode("utf-8", "surrogateescape")
// gives the exact bytes back.
// Exit status: 0 when every request was read (even if some were answered with an error); 1 with one
// "error: ..." line on stderr when the model does not load; 2 for a bad command line or stdin that is not a
// JSON list. Library logs: warnings and errors only, on stderr; stdout carries nothing but the answer.

#include "chat.h"
#include "common.h"
#include "json.h"
#include "llama.h"
#include "log.h"

// llama_vocab::token_eom() has no C API in b11312 (include/llama.h has llama_vocab_eot but no _eom);
// the tool is linked statically against llama, so the internal class is reachable (src/llama-vocab.h:127).
#include "llama-vocab.h"

#include <unistd.h>

#include <algorithm>
#include <clocale>
#include <cstdio>
#include <exception>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

// ------------------------------------------------------------------------------------------- JSON output
// The answers are written by hand: common_json::dump() throws on bytes that are not UTF-8 and dump_safe()
// replaces them, while a token piece may legitimately be part of a character.

// length of the valid UTF-8 sequence starting at s[i], or 0 (RFC 3629: no overlongs, no surrogates, <= U+10FFFF)
size_t utf8_len(const std::string & s, size_t i) {
    const auto b = [&](size_t k) { return (unsigned char) s[k]; };
    const unsigned char c = b(i);
    const size_t        n = s.size() - i;
    const auto          cont = [&](size_t k) { return (b(i + k) & 0xC0) == 0x80; };
    if (c < 0x80) {
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        return n >= 2 && cont(1) ? 2 : 0;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        if (n < 3 || !cont(1) || !cont(2)) {
            return 0;
        }
        if ((c == 0xE0 && b(i + 1) < 0xA0) || (c == 0xED && b(i + 1) >= 0xA0)) {
            return 0;  // overlong, or a UTF-16 surrogate
        }
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (n < 4 || !cont(1) || !cont(2) || !cont(3)) {
            return 0;
        }
        if ((c == 0xF0 && b(i + 1) < 0x90) || (c == 0xF4 && b(i + 1) >= 0x90)) {
            return 0;  // overlong, or above U+10FFFF
        }
        return 4;
    }
    return 0;
}

std::string jstr(const std::string & s) {
    std::string out = "\"";
    char        buf[8];
    for (size_t i = 0; i < s.size();) {
        const unsigned char c = s[i];
        const size_t        n = utf8_len(s, i);
        if (n == 0) {
            snprintf(buf, sizeof(buf), "\\udc%02x", c);
            out += buf;
            i += 1;
            continue;
        }
        if (n == 1) {
            switch (c) {
                case '"':  out += "\\\""; break;
                case '\\': out += "\\\\"; break;
                case '\n': out += "\\n"; break;
                case '\r': out += "\\r"; break;
                case '\t': out += "\\t"; break;
                default:
                    if (c < 0x20 || c == 0x7F) {
                        snprintf(buf, sizeof(buf), "\\u%04x", c);
                        out += buf;
                    } else {
                        out += (char) c;
                    }
            }
        } else {
            out.append(s, i, n);
        }
        i += n;
    }
    return out + "\"";
}

std::string jid(llama_token id) {
    return id == LLAMA_TOKEN_NULL ? "null" : std::to_string(id);
}

std::string jbool(bool b) {
    return b ? "true" : "false";
}

std::string jids(const std::vector<llama_token> & ids) {
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); i++) {
        out += (i ? "," : "") + std::to_string(ids[i]);
    }
    return out + "]";
}

// a message on one line: its lines trimmed, the empty ones dropped, the rest joined with " | "
std::string one_line(const std::string & msg) {
    std::string       out;
    std::stringstream in(msg);
    for (std::string line; std::getline(in, line);) {
        const size_t first = line.find_first_not_of(" \t\r");
        if (first == std::string::npos) {
            continue;
        }
        const size_t last = line.find_last_not_of(" \t\r");
        out += (out.empty() ? "" : " | ") + line.substr(first, last - first + 1);
    }
    return out;
}

std::string jerror(const std::string & msg) {
    return "{\"error\":" + jstr(one_line(msg)) + "}";
}

// ------------------------------------------------------------------------------------------- request fields

struct bad_request : std::runtime_error {
    using std::runtime_error::runtime_error;
};

bool req_bool(const common_json & req, const char * op, const char * key, int def /* -1: required */) {
    if (!req.contains(key)) {
        if (def < 0) {
            throw bad_request(std::string(op) + ": missing '" + key + "' (a boolean)");
        }
        return def != 0;
    }
    const common_json & v = req.at(key);
    if (!v.is_boolean()) {
        throw bad_request(std::string(op) + ": '" + key + "' must be a boolean, got " + v.dump_safe());
    }
    return v.get<bool>();
}

const char * vocab_type_name(enum llama_vocab_type t) {
    switch (t) {  // include/llama.h:72-81
        case LLAMA_VOCAB_TYPE_NONE:   return "none";
        case LLAMA_VOCAB_TYPE_SPM:    return "spm";
        case LLAMA_VOCAB_TYPE_BPE:    return "bpe";
        case LLAMA_VOCAB_TYPE_WPM:    return "wpm";
        case LLAMA_VOCAB_TYPE_UGM:    return "ugm";
        case LLAMA_VOCAB_TYPE_RWKV:   return "rwkv";
        case LLAMA_VOCAB_TYPE_PLAMO2: return "plamo2";
        case LLAMA_VOCAB_TYPE_TEST:   return "test";
    }
    return "unknown";
}

// ------------------------------------------------------------------------------------------- the ops

std::string op_vocab(const llama_vocab * vocab) {
    const int32_t n = llama_vocab_n_tokens(vocab);  // include/llama.h:618
    const std::vector<std::pair<const char *, llama_token>> named = {
        { "bos",     llama_vocab_bos(vocab) },  // include/llama.h:1212-1218, 1230-1232
        { "eos",     llama_vocab_eos(vocab) },
        { "eot",     llama_vocab_eot(vocab) },
        { "eom",     vocab->token_eom() },      // src/llama-vocab.h:127 (no C API)
        { "sep",     llama_vocab_sep(vocab) },
        { "pad",     llama_vocab_pad(vocab) },
        { "fim_pad", llama_vocab_fim_pad(vocab) },
        { "fim_rep", llama_vocab_fim_rep(vocab) },
        { "fim_sep", llama_vocab_fim_sep(vocab) },
    };
    // the end-of-generation set is not exposed as a list: ask llama_vocab_is_eog of every id (llama.h:1206;
    // it is special_eog_ids.count(id), src/llama-vocab.cpp)
    std::vector<llama_token> eog;
    for (llama_token id = 0; id < n; id++) {
        if (llama_vocab_is_eog(vocab, id)) {
            eog.push_back(id);
        }
    }
    std::string out = "{\"n_tokens\":" + std::to_string(n) + ",\"type\":" + jstr(vocab_type_name(llama_vocab_type(vocab)));
    std::vector<llama_token> specials;
    for (const auto & [name, id] : named) {
        out += std::string(",\"") + name + "\":" + jid(id);
        if (id != LLAMA_TOKEN_NULL) {
            specials.push_back(id);
        }
    }
    out += ",\"add_bos\":" + jbool(llama_vocab_get_add_bos(vocab));  // include/llama.h:1220-1222
    out += ",\"add_eos\":" + jbool(llama_vocab_get_add_eos(vocab));
    out += ",\"add_sep\":" + jbool(llama_vocab_get_add_sep(vocab));
    out += ",\"eog\":" + jids(eog);
    specials.insert(specials.end(), eog.begin(), eog.end());
    std::sort(specials.begin(), specials.end());
    specials.erase(std::unique(specials.begin(), specials.end()), specials.end());
    out += ",\"pieces_of_specials\":{";
    for (size_t i = 0; i < specials.size(); i++) {
        // common/common.cpp:1778-1791, the piece llama-tokenize prints (tools/tokenize/tokenize.cpp:199-205)
        out += (i ? ",\"" : "\"") + std::to_string(specials[i]) + "\":" +
               jstr(common_token_to_piece(vocab, specials[i], /*special=*/true));
    }
    return out + "}}";
}

std::string op_tokenize(const llama_vocab * vocab, const common_json & req) {
    if (!req.contains("text") || !req.at("text").is_string()) {
        throw bad_request("tokenize: 'text' must be a string");
    }
    const std::string text          = req.at("text").get<std::string>();
    const bool        add_special   = req_bool(req, "tokenize", "add_special", -1);
    const bool        parse_special = req_bool(req, "tokenize", "parse_special", -1);
    // common_tokenize (common/common.cpp:1755-1775): llama_tokenize into text.length() + 2*add_special slots;
    // a negative count is the size needed, asked for again (include/llama.h:1265-1281)
    const std::vector<llama_token> ids = common_tokenize(vocab, text, add_special, parse_special);
    std::string pieces = "[";
    for (size_t i = 0; i < ids.size(); i++) {
        pieces += (i ? "," : "") + jstr(common_token_to_piece(vocab, ids[i], /*special=*/true));
    }
    return "{\"ids\":" + jids(ids) + ",\"pieces\":" + pieces + "]}";
}

std::string op_detokenize(const llama_vocab * vocab, const common_json & req) {
    if (!req.contains("ids") || !req.at("ids").is_array()) {
        throw bad_request("detokenize: 'ids' must be a list of token ids");
    }
    const int32_t            n = llama_vocab_n_tokens(vocab);
    std::vector<llama_token> ids;
    for (const auto & v : req.at("ids")) {
        if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() >= n) {
            throw bad_request("detokenize: " + v.dump_safe() + " is not a token id (0.." + std::to_string(n - 1) + ")");
        }
        ids.push_back((llama_token) v.get<long long>());
    }
    const bool special = req_bool(req, "detokenize", "special", 1);
    // common/common.cpp:1799-1813: llama_detokenize(remove_special=false, unparse_special=special)
    return "{\"text\":" + jstr(common_detokenize(vocab, ids, special)) + "}";
}

std::string op_render(const llama_model * model, const common_json & req) {
    if (!req.contains("messages") || !req.at("messages").is_array()) {
        throw bad_request("render: 'messages' must be a list of messages");
    }
    std::string tmpl_override;
    if (req.contains("template")) {
        if (!req.at("template").is_string()) {
            throw bad_request("render: 'template' must be a string (the template's text)");
        }
        tmpl_override = req.at("template").get<std::string>();
    }
    // as the server's /apply-template: oaicompat_chat_params_parse (tools/server/server-common.cpp:1320-1372)
    common_chat_templates_inputs inputs;  // common/chat.h:249-267
    inputs.messages              = common_chat_msgs_parse_oaicompat(req.at("messages"));  // chat.cpp:373-472
    inputs.use_jinja             = true;
    inputs.add_generation_prompt = req_bool(req, "render", "add_generation_prompt", 1);
    inputs.force_pure_content    = req_bool(req, "render", "pure", 0);  // direct render only (chat.cpp:1315-1329)
    if (req.contains("tools")) {
        if (!req.at("tools").is_array()) {
            throw bad_request("render: 'tools' must be a list");
        }
        inputs.tools = common_chat_tools_parse_oaicompat(req.at("tools"));
    }
    if (req.contains("chat_template_kwargs")) {
        const common_json & kw = req.at("chat_template_kwargs");
        if (!kw.is_object()) {
            throw bad_request("render: 'chat_template_kwargs' must be an object");
        }
        for (const auto & [k, v] : kw.items()) {
            inputs.chat_template_kwargs[k] = v.dump();  // JSON text, as the server (server-common.cpp:1355-1359)
        }
    }
    // the server's "enable_thinking" kwarg (server-common.cpp:1361-1369); an explicit field wins
    const auto et = inputs.chat_template_kwargs.find("enable_thinking");
    if (et != inputs.chat_template_kwargs.end()) {
        if (et->second == "true" || et->second == "false") {
            inputs.enable_thinking = et->second == "true";
        } else if (!et->second.empty() && et->second[0] == '"') {
            throw bad_request("render: invalid type for \"enable_thinking\" (expected boolean, got string)");
        }
    }
    inputs.enable_thinking = req_bool(req, "render", "enable_thinking", inputs.enable_thinking ? 1 : 0);
    // common/chat.cpp:757-855 (template from tokenizer.chat_template or the override; bos/eos text from the vocab),
    // then chat.cpp:1434-1439 -> common_chat_templates_apply_jinja (1225-1366)
    const common_chat_templates_ptr tmpls  = common_chat_templates_init(model, tmpl_override);
    const common_chat_params        result = common_chat_templates_apply(tmpls.get(), inputs);
    return "{\"prompt\":" + jstr(result.prompt) + "}";
}

std::string answer(const llama_model * model, const common_json & req) {
    try {
        if (!req.is_object() || !req.contains("op") || !req.at("op").is_string()) {
            throw bad_request("a request is an object with a string 'op' (vocab, tokenize, detokenize, render)");
        }
        const std::string   op    = req.at("op").get<std::string>();
        const llama_vocab * vocab = llama_model_get_vocab(model);
        if (op == "vocab") {
            return op_vocab(vocab);
        }
        if (op == "tokenize") {
            return op_tokenize(vocab, req);
        }
        if (op == "detokenize") {
            return op_detokenize(vocab, req);
        }
        if (op == "render") {
            return op_render(model, req);
        }
        throw bad_request("unknown op '" + op + "' (vocab, tokenize, detokenize, render)");
    } catch (const std::exception & e) {
        return jerror(e.what());
    }
}

// library log filter: warnings and errors (and their continuation lines) only
ggml_log_level g_last_level = GGML_LOG_LEVEL_NONE;

void log_filter(ggml_log_level level, const char * text, void * /*user_data*/) {
    if (level != GGML_LOG_LEVEL_CONT) {
        g_last_level = level;
    }
    if (g_last_level == GGML_LOG_LEVEL_WARN || g_last_level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: %s MODEL.gguf < requests.json\n", argv[0]);
        return 2;
    }
    std::setlocale(LC_NUMERIC, "C");  // as tools/tokenize/tokenize.cpp:96

    // stdout carries the answer only: keep it on a private descriptor and point fd 1 at stderr, so that
    // anything the libraries print to stdout (common's LOG(), common/log.cpp:104-117) ends up in the log
    fflush(stdout);
    const int out_fd = dup(STDOUT_FILENO);
    FILE *    out    = out_fd >= 0 ? fdopen(out_fd, "w") : nullptr;
    if (!out || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
        fprintf(stderr, "error: cannot set up stdout\n");
        return 2;
    }

    llama_log_set(log_filter, nullptr);              // include/llama.h:1667 (library logs)
    common_log_set_verbosity_thold(LOG_LEVEL_WARN);  // common/log.h:44 (common's own LOG_INF/LOG_DBG)
    llama_backend_init();

    llama_model_params mparams = llama_model_default_params();
    mparams.vocab_only         = true;  // as llama-tokenize (tools/tokenize/tokenize.cpp:145-147): no tensors
    llama_model * model        = llama_model_load_from_file(argv[1], mparams);
    if (!model) {
        fprintf(stderr, "error: %s: llama.cpp cannot load this model's vocabulary (see the lines above)\n", argv[1]);
        llama_backend_free();
        return 1;
    }

    std::stringstream ss;
    ss << std::cin.rdbuf();
    common_json requests;
    try {
        requests = common_json::parse(ss.str());  // common/json.h:164
    } catch (const std::exception & e) {
        fprintf(stderr, "error: stdin is not JSON: %s\n", one_line(e.what()).c_str());
        llama_model_free(model);
        llama_backend_free();
        return 2;
    }
    if (!requests.is_array()) {
        fprintf(stderr, "error: stdin must be a JSON list of requests\n");
        llama_model_free(model);
        llama_backend_free();
        return 2;
    }

    std::string result = "[";
    size_t      i      = 0;
    for (const auto & req : requests) {
        result += (i++ ? ",\n" : "\n") + answer(model, req);
    }
    result += "\n]\n";
    const bool ok = fwrite(result.data(), 1, result.size(), out) == result.size() && fflush(out) == 0;

    llama_model_free(model);
    llama_backend_free();
    if (!ok) {
        fprintf(stderr, "error: cannot write the answers to stdout\n");
        return 2;
    }
    return 0;
}
