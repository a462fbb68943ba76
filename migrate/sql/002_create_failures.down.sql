DROP TABLE IF EXISTS {{failures}};
