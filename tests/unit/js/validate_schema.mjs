// Validate JSON documents against a JSON Schema (draft 2020-12) with Ajv, whose
// "pattern" keyword runs JavaScript's own regular expressions (ECMA-262, u flag): how
// a JavaScript client reads the published schema.
// Usage: node validate_schema.mjs SCHEMA.json < documents.json  ->  [true, false, ...]
import { readFileSync } from "node:fs";
import Ajv2020 from "ajv/dist/2020.js";

const schema = JSON.parse(readFileSync(process.argv[2], "utf8"));
const documents = JSON.parse(readFileSync(0, "utf8"));
const validate = new Ajv2020({ strict: false, allErrors: true }).compile(schema);
process.stdout.write(JSON.stringify(documents.map((document) => validate(document))));
