"""Region proposal network layers (py-faster-rcnn's ``rpn`` package, written anew for Python 3 and
pycaffe-lite): ``rpn.proposal_layer.ProposalLayer``, ``rpn.anchor_target_layer.AnchorTargetLayer``,
``rpn.proposal_target_layer.ProposalTargetLayer``, as the original prototxts name them."""
