// pipec-data: writes a PIPECDS1 data set (docs/dataset-format.md) from NumPy
// arrays, an .npz archive or a folder of .npy files, one array per field
// named after the model's inputs and labels. piperun reads such arrays
// directly; the converted file is for data sets larger than memory when the
// archive is compressed, and for a data set written once and read by every
// run.
//
//   pipec-data ARRAYS OUT [--fields a,b,...]
#include "NumpyArrays.h"

#include <CLI/CLI.hpp>

#include <iostream>

using namespace pipec;

int main(int argc, char **argv) {
  CLI::App app{"pipec-data: a PIPECDS1 data set (docs/dataset-format.md) from an .npz archive or a folder of .npy "
               "arrays"};
  std::string source, out;
  std::vector<std::string> fields;
  app.add_option("ARRAYS", source, ".npz archive or folder of .npy files (the first dimension: the samples)")
      ->required();
  app.add_option("OUT", out, "the data set to write")->required();
  app.add_option("--fields", fields, "only these arrays, in this order (default: every array, by name)")
      ->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  try {
    std::optional<std::set<std::string>> wanted;
    if (!fields.empty()) wanted = std::set<std::string>(fields.begin(), fields.end());
    std::unique_ptr<io::DataSource> arrays = rt::openNumpyArrays(source, wanted);
    std::vector<io::FieldSpec> specs;
    for (const std::string &name : fields) {
      const int index = arrays->fieldIndex(name);
      if (index < 0) throw io::FormatError(source + ": no array named " + name);
      specs.push_back(arrays->fields()[index]);
    }
    if (fields.empty()) specs = arrays->fields();
    std::vector<std::vector<char>> data;
    for (const io::FieldSpec &spec : specs) {
      data.emplace_back(spec.sampleBytes() * arrays->numSamples());
      arrays->read(arrays->fieldIndex(spec.name), 0, arrays->numSamples(), data.back().data());
    }
    io::writeDataset(out, specs, arrays->numSamples(), data);
    std::cout << "wrote " << out << ": " << arrays->numSamples() << " samples of";
    for (const io::FieldSpec &spec : specs)
      std::cout << " " << spec.name << " " << io::dtypeName(spec.dtype) << io::shapeString(spec.shape);
    std::cout << "\n";
  } catch (const std::exception &e) {
    std::cerr << "pipec-data: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
