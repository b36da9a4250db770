// The Hugging Face Hub's file labels, from the real library: writes tests/data/hub_labels.json, the answers of
// parseGGUFQuantLabel (@huggingface/tasks 0.21.54, src/gguf.ts) for the names the tests of pipeline/naming.py use
// (tests/unit/test_naming_hub.py compares naming.hub_label with them).
//
//   npm install --prefix /tmp/hubnpm @huggingface/tasks@0.21.54
//   node tests/data/hub_labels.mjs /tmp/hubnpm
//
// The argument (or HUB_NPM_PREFIX) is the npm prefix the package was installed under. The script refuses any
// other version, checks the upstream spec's expectations (packages/gguf/src/gguf.spec.ts, "parse quant label"
// and "parse quant label groups") against the library before writing, and writes the labels in corpus order
// (null: no label).

import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const VERSION = "0.21.54";
const prefix = process.argv[2] ?? process.env.HUB_NPM_PREFIX;
if (!prefix) {
	console.error("usage: node tests/data/hub_labels.mjs <npm prefix holding @huggingface/tasks@" + VERSION + ">");
	process.exit(2);
}
const pkgDir = path.join(path.resolve(prefix), "node_modules", "@huggingface", "tasks");
const pkg = JSON.parse(fs.readFileSync(path.join(pkgDir, "package.json"), "utf8"));
if (pkg.name !== "@huggingface/tasks" || pkg.version !== VERSION) {
	console.error(`${pkgDir} holds ${pkg.name} ${pkg.version}, not @huggingface/tasks ${VERSION}`);
	process.exit(1);
}
// the package's own ESM entry ("exports" → "." → "import")
const tasks = await import(pathToFileURL(path.join(pkgDir, pkg.exports["."].import.default)).href);
const { parseGGUFQuantLabel, GGUF_QUANT_RE, GGMLFileQuantizationType } = tasks;

// ------------------------------------------------------------------ the upstream spec's cases, as written there
const SPEC = [
	["Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", "Q4_K_M"],
	["subdir/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", "Q4_K_M"],
	["Codestral-22B-v0.1-Q2_K.gguf", "Q2_K"],
	["Codestral-22B-v0.1.gguf", undefined],
	["Codestral-22B-v0.1-F32-Q2_K.gguf", "Q2_K"],
	["Codestral-22B-v0.1-IQ3_XS.gguf", "IQ3_XS"],
	["Codestral-22B-v0.1-Q4_0_4_4.gguf", "Q4_0"],
	["Qwen3-4B-UD-Q2_K_XL.gguf", "UD-Q2_K_XL"],
	["gpt-oss-20b-MXFP4.gguf", "MXFP4"],
	["gpt-oss-120b-MXFP4.gguf", "MXFP4"],
	["Qwable-v1-35B-A3B-MXFP4_MOE.gguf", "MXFP4_MOE"],
];
const SPEC_GROUPS = [
	["gemma-2-9b-it-Q6_K_L.gguf", { prefix: undefined, quant: "Q6_K", sizeVariation: "L" }],
	["Qwen3-4B-UD-Q2_K_XL.gguf", { prefix: "UD-", quant: "Q2_K", sizeVariation: "XL" }],
	["Qwable-v1-35B-A3B-MXFP4_MOE.gguf", { prefix: undefined, quant: "MXFP4_MOE", sizeVariation: undefined }],
	["gpt-oss-20b-MXFP4.gguf", { prefix: undefined, quant: "MXFP4", sizeVariation: undefined }],
];
// the file names of the spec's download URLs (not label cases there, but real Hub names)
const SPEC_URL_FILES = [
	"llama-2-7b-chat.Q2_K.gguf",
	"mistral-7b-instruct-v0.2.Q5_K_M.gguf",
	"gemma-2b-it-q4_k_m.gguf",
	"bert-bge-small/ggml-model-f16-big-endian.gguf",
	"tinyllamas-stories-260k-f32.gguf",
	"grok-1-IQ3_XS-split-00001-of-00009.gguf",
	"UD-Q3_K_XL/Kimi-K2.5-UD-Q3_K_XL-00001-of-00011.gguf",
];
for (const [name, want] of SPEC) {
	const got = parseGGUFQuantLabel(name);
	if (got !== want) throw new Error(`spec case ${name}: library says ${got}, spec ${want}`);
}
for (const [name, want] of SPEC_GROUPS) {
	const { prefix: p, quant, sizeVariation } = parseGGUFQuantLabel(name)?.match(GGUF_QUANT_RE)?.groups ?? {};
	const got = { prefix: p, quant, sizeVariation };
	if (JSON.stringify(got) !== JSON.stringify(want)) throw new Error(`spec group case ${name}: ${JSON.stringify(got)}`);
}

// ------------------------------------------------------------------ the corpus
// llama-quantize's type names, tools/quantize/quantize.cpp:35-74 of the pinned tree (b11312), in its order
const QUANTIZE_TYPES = [
	"Q1_0", "Q2_0", "Q4_0", "Q4_1", "MXFP4_MOE", "Q5_0", "Q5_1", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S",
	"IQ1_M", "TQ1_0", "TQ2_0", "Q2_K", "Q2_K_S", "IQ3_XXS", "IQ3_S", "IQ3_M", "Q3_K", "IQ3_XS", "Q3_K_S", "Q3_K_M",
	"Q3_K_L", "IQ4_NL", "IQ4_XS", "Q4_K", "Q4_K_S", "Q4_K_M", "Q5_K", "Q5_K_S", "Q5_K_M", "Q6_K", "Q8_0", "F16",
	"BF16", "F32", "COPY",
];
// the library's own file types (GGMLFileQuantizationType, declaration order) and its file name alias
const HUB_TYPES = [...Object.values(GGMLFileQuantizationType).filter((v) => typeof v === "string"), "MXFP4"];
const DEMO_LABELS = [
	"F16", "Q8_0", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q4_K_M_IMAT", "Q4_K_M_AWQ", "Q4_K_M_AWQIMAT", "Q3_K_M_IMAT",
	"Q3_K_M_AWQ", "Q3_K_M_AWQIMAT", "Q4_0",
];
const DEMO_NAMES = ["smollm2-135m", "smollm2-135m-calib", "smollm2-135m-draft"];

const corpus = [];
corpus.push(...SPEC.map(([n]) => n), ...SPEC_GROUPS.map(([n]) => n), ...SPEC_URL_FILES);
for (const t of QUANTIZE_TYPES) {
	const l = t.toLowerCase();
	corpus.push(
		`m-${t}.gguf`, `m-${t}_IMAT.gguf`, `m-${t}_AWQ.gguf`, `m-${t}_AWQIMAT.gguf`, `m-${t}-imat.gguf`,
		`m-${t}-awq.gguf`, `m-${l}.gguf`, `m-${l}_imat.gguf`, `m-${t}_MTP.gguf`, `m-mtp-${t}_MTP.gguf`,
	);
}
for (const t of HUB_TYPES) corpus.push(`m-${t}.gguf`, `m-${t}_IMAT.gguf`, `m-UD-${t}.gguf`, `m.${t}.gguf`);
corpus.push(
	// MTP sidecars, old and new
	"m-mtp-F16.gguf", "m-mtp-F16_MTP.gguf", "m-mtp-BF16_MTP.gguf", "m-mtp-BF16.gguf", "m-mtp-Q8_0_MTP.gguf",
	"mtp-F16_MTP.gguf", "m-MTP-F16.gguf",
	// split files: the folder and its shards, new and old style
	"m-Q4_K_M_IMAT/m-Q4_K_M_IMAT-00001-of-00003.gguf", "m-Q4_K_M_IMAT/m-Q4_K_M_IMAT-00002-of-00003.gguf",
	"m-Q4_K_M_IMAT/m-Q4_K_M_IMAT-00003-of-00003.gguf", "m-F16/m-F16-00001-of-00002.gguf",
	"m-Q4_K_M/m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-imat/m-Q4_K_M-imat-00001-of-00002.gguf",
	"m-Q4_K_M-imat-00001-of-00002.gguf", "m-mtp-F16_MTP/m-mtp-F16_MTP-00001-of-00002.gguf",
	"Q4_K_M/m.gguf", "Q4_K_M_IMAT/m-F16.gguf",
	// digits and other characters in the variant
	"m-Q4_K_M_AWQ2.gguf", "m-Q4_K_M_IMAT2.gguf", "m-Q4_K_M_2.gguf", "m-Q4_K_M_V2.gguf", "m-Q4_K_M_AWQ-IMAT.gguf",
	"m-Q4_K_M_AWQ_IMAT.gguf", "m-Q4_K_M_IMAT.AWQ.gguf", "m-Q4_K_M_imat.gguf", "m-Q4_K_M__IMAT.gguf",
	"m-Q4_K_M_.gguf", "m-Q4_K_M_IMATRIX.gguf", "m-Q8_0_L.gguf", "m-Q6_K_L.gguf", "m-Q4_0_4_4_IMAT.gguf",
	"m-UD-Q4_K_XL_IMAT.gguf", "m-MXFP4_MOE_IMAT.gguf", "m-MXFP4_IMAT.gguf",
	// quant-like text in the model name or after the label
	"q8_0-tuned-Q4_K_M.gguf", "Q8_0-distill-F16.gguf", "llama-bf16-base-Q4_0.gguf", "f16-Q4_K_M_IMAT.gguf",
	"m-Q4_K_M_IMAT-f16.gguf", "m-Q4_K_M.imat.gguf", "qwen2.5-q4_k_m-ft-Q8_0_IMAT.gguf", "m-Q4_K_M-v2.gguf",
	"m-IQ4_XS-Q4_K_M.gguf", "m-Q4_K_M-IQ4_XS.gguf", "IQ2_XXS.gguf", "m-Q4_K_M", "m-Q4_K_M.bin", "m.gguf",
	// case and non-ASCII
	"M-Q4_K_M_IMAT.GGUF", "smollm2-135m-q4_k_m_imat.gguf", "Straße-q8_0.gguf", "modèle-q4_k_m-awq.gguf",
	"m-ﬁ-Q4_0.gguf",
);
for (const name of DEMO_NAMES) {
	for (const label of DEMO_LABELS) corpus.push(`${name}-${label}.gguf`);
	// the names before issue #16, and the MTP draft
	for (const v of ["imat", "awq", "awqimat"]) corpus.push(`${name}-Q4_K_M-${v}.gguf`, `${name}-Q3_K_M-${v}.gguf`);
	corpus.push(`${name}-mtp-F16.gguf`, `${name}-mtp-F16_MTP.gguf`);
}

const labels = {};
for (const name of corpus) {
	if (!(name in labels)) labels[name] = parseGGUFQuantLabel(name) ?? null;
}
const out = path.join(path.dirname(fileURLToPath(import.meta.url)), "hub_labels.json");
const doc = { source: `@huggingface/tasks ${VERSION} parseGGUFQuantLabel`, labels };
fs.writeFileSync(out, JSON.stringify(doc, null, 1) + "\n");
console.log(`${out}: ${Object.keys(labels).length} names`);
