// node testdata/duckdb/query.mjs FILE.parquet
// Prints {"columns": ["name:TYPE", ...], "rows": [{...}, ...]} as DuckDB
// reads the file; 64-bit integers are printed as strings.
import { DuckDBInstance } from '@duckdb/node-api';

const file = process.argv[2];
const inst = await DuckDBInstance.create(':memory:');
const con = await inst.connect();
const esc = file.replaceAll("'", "''");
const desc = await con.runAndReadAll(`DESCRIBE SELECT * FROM read_parquet('${esc}')`);
const columns = desc.getRowObjects().map(r => `${r.column_name}:${r.column_type}`);
const data = await con.runAndReadAll(`SELECT * FROM read_parquet('${esc}')`);
const rows = data.getRowObjects().map(r =>
  Object.fromEntries(Object.entries(r).map(([k, v]) => [k, typeof v === 'bigint' ? v.toString() : v])));
console.log(JSON.stringify({ columns, rows }));
